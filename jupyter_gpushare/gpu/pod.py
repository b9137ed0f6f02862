"""The GPU capacity a container may really use, where a device plugin limits it (HAMi)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence

from .base import Card

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


def apply_pod_limits(cards: Sequence[Card], environ: Mapping[str, str] | None = None) -> list[Card]:
    """The cards with the capacity this pod may really use (applied by NvmlBackend.cards()).

    HAMi sets ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` for the i-th device the container sees (``i`` = the
    card's index in this process), or ``CUDA_DEVICE_MEMORY_LIMIT`` for every device. A card's
    capacity becomes the smaller of that limit and what NVML reports; other cards are unchanged.
    Without HAMi variables this returns the cards as they are (whole GPU, or MIG device).
    """
    env = os.environ if environ is None else environ
    everywhere = parse_hami_limit(env.get(HAMI_LIMIT, ""))
    out = []
    for card in cards:
        limit = parse_hami_limit(env.get(f"{HAMI_LIMIT}_{card.index}", ""))
        limit = limit if limit is not None else everywhere
        if limit is not None and limit < card.total_mib:
            card = dataclasses.replace(card, total_mib=limit)
        out.append(card)
    return out
