"""JupyterHub on Kubernetes (deployment mode 3): profile generation, and the pod's view of its GPU slice.

The scheduler gives each user pod a whole GPU, a MIG slice or a HAMi slice; inside the pod the
extension's embedded ledger divides that slice among the user's kernels. NVML inside a pod sees its
whole GPU or its MIG device, so its capacity is right as read. Under HAMi, NVML may show the whole
physical card while HAMi-core caps the container at ``CUDA_DEVICE_MEMORY_LIMIT`` (or
``CUDA_DEVICE_MEMORY_LIMIT_<i>`` per device): :func:`apply_pod_limits` makes that the card's capacity.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .gpu.pod import apply_pod_limits, parse_hami_limit  # noqa: F401 (re-exported)
from .policy import PolicyError, parse_size

MIG_PROFILE_RE = re.compile(r"^\d+g\.\d+gb(\+me)?$")


# -- Zero-to-JupyterHub / KubeSpawner profiles ---------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def profile_list(
    whole_gpu: bool = False,
    mig: Sequence[str] = (),
    hami_gpumem: Sequence[int] = (),
    hami_gpucores: int | None = None,
    cpu_profile: bool = True,
    default_quota: str = "25%",
) -> list[dict[str, Any]]:
    """KubeSpawner ``profile_list`` entries: one per slice kind, each asking the scheduler for it.

    ``mig`` profiles use the NVIDIA device plugin's mixed strategy (``nvidia.com/mig-<profile>``);
    ``hami_gpumem`` slices are MiB of one GPU (HAMi's ``nvidia.com/gpumem``), optionally with an SM
    share (``nvidia.com/gpucores``, percent). Raises PolicyError for a malformed value.
    """
    profiles: list[dict[str, Any]] = []
    quota_note = f"Each notebook kernel gets {default_quota} of it by default; the JupyterLab GPU panel shows the rest."
    if cpu_profile:
        profiles.append(
            {"display_name": "CPU only", "slug": "cpu", "description": "No GPU.", "kubespawner_override": {}}
        )
    if whole_gpu:
        profiles.append(
            {
                "display_name": "One GPU",
                "slug": "gpu-whole",
                "description": f"A whole GPU for your server. {quota_note}",
                "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "1"}},
            }
        )
    for name in mig:
        if not MIG_PROFILE_RE.match(name):
            raise PolicyError(f"--mig: {name!r} is not a MIG profile; use e.g. '1g.10gb' or '3g.40gb'.")
        profiles.append(
            {
                "display_name": f"GPU slice (MIG {name})",
                "slug": f"gpu-mig-{_slug(name)}",
                "description": f"A MIG {name} instance: its own memory and compute, isolated in hardware. {quota_note}",
                "kubespawner_override": {"extra_resource_limits": {f"nvidia.com/mig-{name}": "1"}},
            }
        )
    for mib in hami_gpumem:
        if int(mib) <= 0:
            raise PolicyError(f"--hami-gpumem: {mib!r} is not a memory size in MiB; use e.g. 8000.")
        if hami_gpucores is not None and not 0 < hami_gpucores <= 100:
            raise PolicyError(f"--hami-gpucores: {hami_gpucores!r} is not a percentage; use e.g. 30.")
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(int(mib))}
        if hami_gpucores is not None:
            limits["nvidia.com/gpucores"] = str(hami_gpucores)
        cores = f", {hami_gpucores}% of its cores" if hami_gpucores is not None else ""
        profiles.append(
            {
                "display_name": f"GPU share ({int(mib)} MiB, HAMi)",
                "slug": f"gpu-hami-{int(mib)}m",
                "description": f"{int(mib)} MiB of a shared GPU{cores}, capped by HAMi. {quota_note}",
                "kubespawner_override": {"extra_resource_limits": limits},
            }
        )
    if profiles:
        profiles[0]["default"] = True
    return profiles


def pod_config(
    default_quota: str = "25%", card_headroom: str = "256MiB", context_reserve: str = "640MiB"
) -> dict[str, Any]:
    """GpuShareApp settings for the server inside a user pod: the embedded ledger on pod-local disk
    (a home volume may be NFS, where SQLite's WAL mode is unsafe), quotas as shares of the slice."""
    for name, value in (
        ("default_quota", default_quota),
        ("card_headroom", card_headroom),
        ("context_reserve", context_reserve),
    ):
        parse_size(value, f"--{name.replace('_', '-')}", allow_percent=name != "context_reserve")
    return {
        "GpuShareApp": {
            "gpu_backend": "auto",
            "ledger_path": "/tmp/jupyter-gpushare/ledger.sqlite",
            "default_quota": default_quota,
            "card_headroom": card_headroom,
            "context_reserve": context_reserve,
        }
    }


def z2jh_values(
    whole_gpu: bool = False,
    mig: Sequence[str] = (),
    hami_gpumem: Sequence[int] = (),
    hami_gpucores: int | None = None,
    cpu_profile: bool = True,
    default_quota: str = "25%",
    card_headroom: str = "256MiB",
    config_path: str = "/etc/jupyter/jupyter_server_config.json",
) -> dict[str, Any]:
    """Zero-to-JupyterHub ``values.yaml`` fragment: ``singleuser.profileList``, ``extraEnv``, ``extraFiles``."""
    profiles = profile_list(whole_gpu, mig, hami_gpumem, hami_gpucores, cpu_profile, default_quota)
    if not any(p["kubespawner_override"] for p in profiles):
        raise PolicyError("Ask for at least one GPU profile: --whole-gpu, --mig 1g.10gb or --hami-gpumem 8000.")
    return {
        "singleuser": {
            "profileList": profiles,
            "extraEnv": {
                # kernels started by nbclient/papermill in a terminal get quotas too
                "JUPYTER_DEFAULT_PROVISIONER_NAME": "gpushare-provisioner",
            },
            "extraFiles": {
                "jupyter-gpushare": {"mountPath": config_path, "data": pod_config(default_quota, card_headroom)},
            },
        }
    }


def dump(values: dict[str, Any], fmt: str = "yaml") -> str:
    """YAML (PyYAML when installed; JSON otherwise, which is YAML too) or JSON text."""
    if fmt == "yaml":
        try:
            import yaml
        except ImportError:
            return json.dumps(values, indent=2)
        return yaml.safe_dump(values, sort_keys=False, default_flow_style=False)
    return json.dumps(values, indent=2)
