"""The GPU capacity a container may really use, where a device plugin limits it (HAMi).

HAMi's device plugin gives a container its share of a GPU as ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (and
preloads HAMi-core, which enforces it). Where HAMi-core's NVML hook is loaded in this process, NVML reports
the share itself; where it is not, NVML reports the whole physical card, other pods' memory included. Either
way the card's capacity is the share (:func:`apply_pod_limits`), and figures NVML gives for the whole card
are not this pod's (:func:`limit_samples`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence

from .base import Card, DeviceSample

HAMI_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
_HAMI_RE = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)\s*$")
_HAMI_UNIT_MIB = {"": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024}


def parse_hami_limit(text: str) -> int | None:
    """HAMi-core's memory limit text in MiB: '8000m' -> 8000, '1g' -> 1024, '1073741824' (bytes) -> 1024.

    None for an empty or malformed value (HAMi-core then applies no limit either).
    """
    m = _HAMI_RE.match(text or "")
    if not m:
        return None
    mib = int(int(m.group(1)) * _HAMI_UNIT_MIB[m.group(2).lower()])
    return mib if mib > 0 else None


def pod_limit_mib(index: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The memory HAMi gives this container on its ``index``-th device, in MiB; None without a HAMi limit.

    HAMi sets ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` for the i-th device the container sees, or
    ``CUDA_DEVICE_MEMORY_LIMIT`` for every device.
    """
    env = os.environ if environ is None else environ
    limit = parse_hami_limit(env.get(f"{HAMI_LIMIT}_{index}", ""))
    return limit if limit is not None else parse_hami_limit(env.get(HAMI_LIMIT, ""))


def apply_pod_limits(cards: Sequence[Card], environ: Mapping[str, str] | None = None) -> list[Card]:
    """The cards with the capacity this pod may really use (applied by NvmlBackend.cards()).

    A card's capacity becomes the smaller of its HAMi limit (:func:`pod_limit_mib`, ``i`` = the card's
    index in this process) and what NVML reports; other cards are unchanged. Without HAMi variables this
    returns the cards as they are (whole GPU, or MIG device).
    """
    out = []
    for card in cards:
        limit = pod_limit_mib(card.index, environ)
        if limit is not None and limit < card.total_mib:
            card = dataclasses.replace(card, total_mib=limit)
        out.append(card)
    return out


def limit_samples(samples: Sequence[DeviceSample]) -> list[DeviceSample]:
    """The samples measured against the capacity of their cards (for NvmlBackend.sample(), after cards()).

    A sample whose NVML total exceeds its card's capacity was read from the whole physical card under a
    HAMi share (HAMi-core's NVML hook not loaded here): its used and free memory are the card's, other
    pods' use included, and its process list is every container's on the card, none of which says what
    this pod uses of its share. Those figures become "not available" with the reason, and the total is
    the share. Other samples (a whole GPU, a MIG instance, HAMi with its hook) are returned as they are.
    """
    out = []
    for sample in samples:
        share = sample.card.total_mib
        if sample.total_mib is not None and sample.total_mib > share:
            why = (
                f"NVML reports the whole GPU ({sample.total_mib} MiB), not this pod's {share} MiB share (HAMi): "
                "what the pod uses of its share is not measured."
            )
            sample = dataclasses.replace(
                sample,
                total_mib=share,
                used_mib=None,
                free_mib=None,
                processes=(),
                errors={**sample.errors, "memory": why, "processes": why},
            )
        out.append(sample)
    return out
