"""JupyterHub on Kubernetes (deployment mode 3): profile generation, and the pod's view of its GPU slice.

The scheduler gives each user pod a whole GPU, a MIG slice or a HAMi slice; inside the pod the
extension's embedded ledger divides that slice among the user's kernels. :func:`z2jh_values` writes the
Zero-to-JupyterHub values for that: one KubeSpawner profile per slice kind, each asking for the
resource its device plugin advertises, placed on the nodes that have it (tests/cli/test_k8s_render.py
renders every profile with KubeSpawner itself), and the extension's settings for the pod. NVML inside
a pod sees its whole GPU or its MIG device, so its capacity is right as read. Under HAMi, NVML may
show the whole physical card while HAMi-core caps the container at ``CUDA_DEVICE_MEMORY_LIMIT`` (or
``CUDA_DEVICE_MEMORY_LIMIT_<i>`` per device): :func:`apply_pod_limits` makes that the card's capacity.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.policy import PolicyError, parse_size
from ..host.gpu.pod import apply_pod_limits, parse_hami_limit  # noqa: F401 (re-exported)

# A MIG profile as NVIDIA names it: "1g.10gb", "1g.10gb+me" (media extensions), "1g.24gb+me.all", "1g.24gb-me".
MIG_PROFILE_RE = re.compile(r"^\d+g\.\d+gb(?:[+-][a-z]+(?:\.[a-z]+)?)?$")

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU feature discovery's node label (GPU operator)
HAMI_WEBHOOK_LABEL = "hami.io/webhook"  # a pod labelled "ignore" is left alone by HAMi's admission webhook
HAMI_SCHEDULER = "hami-scheduler"  # HAMi's Helm chart default (its `schedulerName` value)
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
# Zero-to-JupyterHub's default scheduling.userPods.tolerations. A profile's `tolerations` replaces the
# chart's list (KubeSpawner merges dicts, not lists), so GPU profiles repeat them.
Z2JH_USER_TOLERATIONS = (
    {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
    {"key": "hub.jupyter.org_dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: its names as NVML (and nvidia-smi) report them, one per board, and its MIG profiles."""

    names: tuple[str, ...]
    mig_profiles: tuple[str, ...] = ()


_MIG_80GB = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
# NVIDIA's MIG user guide, "Supported MIG Profiles" (and mig-parted's config-default.yaml).
GPU_MODELS: dict[str, GpuModel] = {
    "A30": GpuModel(("NVIDIA A30",), ("1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb")),
    "A100-40GB": GpuModel(
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    ),
    "A100-80GB": GpuModel(("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"), _MIG_80GB),
    "H100-80GB": GpuModel(("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"), _MIG_80GB),
    "H100-94GB": GpuModel(
        ("NVIDIA H100 NVL",), ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")
    ),
    "H200-141GB": GpuModel(
        ("NVIDIA H200", "NVIDIA H200 NVL"),
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    ),
    "L4": GpuModel(("NVIDIA L4",)),
}


# -- Zero-to-JupyterHub / KubeSpawner profiles ---------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def product_label(name: str) -> str:
    """The value GPU feature discovery gives a node's ``nvidia.com/gpu.product`` label for a GPU ``name``
    (as nvidia-smi prints it): 'NVIDIA H100 80GB HBM3' -> 'NVIDIA-H100-80GB-HBM3'. A label passes unchanged.
    (Its rule: drop characters other than letters, digits, '-', '_', '.' and spaces, then join the words with
    '-'. With MIG strategy `single`, or GPUs shared by time-slicing, GFD adds a suffix; this is the plain name.)"""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


def gpu_model(product: str) -> GpuModel | None:
    """The model of GPU_MODELS a product name or label stands for; None for one not listed."""
    label = product_label(product).lower()
    return next((m for m in GPU_MODELS.values() if label in (product_label(n).lower() for n in m.names)), None)


def mig_resource(profile: str) -> str:
    """The extended resource the NVIDIA device plugin (MIG strategy `mixed`) advertises for a MIG profile:
    'nvidia.com/mig-1g.10gb'; a '+' becomes '.', as Kubernetes resource names cannot hold it
    ('1g.10gb+me' -> 'nvidia.com/mig-1g.10gb.me')."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def _check_mig(name: str, product: str | None) -> None:
    if not MIG_PROFILE_RE.match(name):
        raise PolicyError(f"--mig: {name!r} is not a MIG profile; use e.g. '1g.10gb' or '3g.40gb'.")
    model = gpu_model(product) if product else None
    if model is not None and name not in model.mig_profiles:
        raise PolicyError(
            f"--mig: {product} has no MIG profile {name!r}; it has {', '.join(model.mig_profiles) or 'none'}."
        )


def _gpu_tolerations() -> list[dict[str, str]]:
    """The chart's user-pod tolerations and the GPU taint's: a fresh list for each profile."""
    return [*map(dict, Z2JH_USER_TOLERATIONS), dict(GPU_TOLERATION)]


def profile_list(
    whole_gpu: bool = False,
    mig: Sequence[str] = (),
    hami_gpumem: Sequence[int] = (),
    hami_gpucores: int | None = None,
    cpu_profile: bool = True,
    default_quota: str = "25%",
    whole_gpu_product: str | None = None,
    mig_product: str | None = None,
    hami_scheduler: str = HAMI_SCHEDULER,
) -> list[dict[str, Any]]:
    """KubeSpawner ``profile_list`` entries: one per slice kind, each asking the scheduler for it.

    ``mig`` profiles use the NVIDIA device plugin's mixed strategy (:func:`mig_resource`);
    ``hami_gpumem`` slices are MiB of one GPU (HAMi's ``nvidia.com/gpumem``), optionally with an SM
    share (``nvidia.com/gpucores``, percent), placed by HAMi's scheduler (``hami_scheduler``).
    ``whole_gpu_product`` / ``mig_product`` (a GPU's name as nvidia-smi prints it, or its node label)
    pin those profiles to nodes with that GPU (node selector on ``nvidia.com/gpu.product``), and check
    the MIG profiles against the model's. Every GPU profile tolerates the ``nvidia.com/gpu`` taint.
    Raises PolicyError for a malformed value.
    """
    profiles: list[dict[str, Any]] = []
    quota_note = f"Each notebook kernel gets {default_quota} of it by default; the JupyterLab GPU panel shows the rest."
    if cpu_profile:
        profiles.append(
            {
                "display_name": "CPU only",
                "slug": "cpu",
                "description": "No GPU.",
                # Images built on CUDA's set NVIDIA_VISIBLE_DEVICES=all; where the NVIDIA runtime is the
                # default (GPU operator), a pod on a GPU node would see every GPU of it, other pods' too.
                "kubespawner_override": {"environment": {"NVIDIA_VISIBLE_DEVICES": "void"}},
            }
        )
    if whole_gpu:
        override: dict[str, Any] = {
            "extra_resource_limits": {"nvidia.com/gpu": "1"},
            # Where HAMi runs, its webhook sends every pod that asks for nvidia.com/gpu to its scheduler,
            # which places pods on HAMi's nodes only: a whole GPU comes from the NVIDIA device plugin.
            "extra_labels": {HAMI_WEBHOOK_LABEL: "ignore"},
            "tolerations": _gpu_tolerations(),
        }
        if whole_gpu_product:
            override["node_selector"] = {GPU_PRODUCT_LABEL: product_label(whole_gpu_product)}
        what = f"A whole {whole_gpu_product}" if whole_gpu_product else "A whole GPU"
        profiles.append(
            {
                "display_name": f"One GPU ({whole_gpu_product})" if whole_gpu_product else "One GPU",
                "slug": "gpu-whole",
                "description": f"{what} for your server. {quota_note}",
                "kubespawner_override": override,
            }
        )
    for name in mig:
        _check_mig(name, mig_product)
        override = {"extra_resource_limits": {mig_resource(name): "1"}, "tolerations": _gpu_tolerations()}
        if mig_product:
            override["node_selector"] = {GPU_PRODUCT_LABEL: product_label(mig_product)}
        of = f" ({mig_product})" if mig_product else ""
        profiles.append(
            {
                "display_name": f"GPU slice (MIG {name})",
                "slug": f"gpu-mig-{_slug(name)}",
                "description": f"A MIG {name} instance{of}: its own memory and compute, isolated in hardware. "
                f"{quota_note}",
                "kubespawner_override": override,
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
                "kubespawner_override": {
                    "extra_resource_limits": limits,
                    # Zero-to-JupyterHub names its own user scheduler, and HAMi's webhook leaves a pod
                    # with a scheduler of its own alone: without HAMi's scheduler the slice is never
                    # assigned, and HAMi's device plugin refuses the pod on the node.
                    "scheduler_name": hami_scheduler,
                    "tolerations": _gpu_tolerations(),
                },
            }
        )
    if profiles:
        profiles[0]["default"] = True
    return profiles


def pod_config(
    default_quota: str = "25%", card_headroom: str = "256MiB", context_reserve: str = "640MiB"
) -> dict[str, Any]:
    """Settings for the server inside a user pod: the extension enabled explicitly (the wheel's own
    ``jupyter_server_config.d`` file enables it only for servers that read the config of the environment
    it was installed into), the embedded ledger on pod-local disk (a home volume may be NFS, where
    SQLite's WAL mode is unsafe), quotas as shares of the slice."""
    for name, value in (
        ("default_quota", default_quota),
        ("card_headroom", card_headroom),
        ("context_reserve", context_reserve),
    ):
        parse_size(value, f"--{name.replace('_', '-')}", allow_percent=name != "context_reserve")
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpushare": True}},
        "GpuShareApp": {
            "gpu_backend": "auto",
            "ledger_path": "/tmp/jupyter-gpushare/ledger.sqlite",
            "default_quota": default_quota,
            "card_headroom": card_headroom,
            "context_reserve": context_reserve,
        },
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
    whole_gpu_product: str | None = None,
    mig_product: str | None = None,
    hami_scheduler: str = HAMI_SCHEDULER,
) -> dict[str, Any]:
    """Zero-to-JupyterHub ``values.yaml`` fragment: ``singleuser.profileList``, ``extraEnv``, ``extraFiles``
    (and, with HAMi profiles, ``cloudMetadata``)."""
    if not (whole_gpu or mig or hami_gpumem):
        raise PolicyError("Ask for at least one GPU profile: --whole-gpu, --mig 1g.10gb or --hami-gpumem 8000.")
    profiles = profile_list(
        whole_gpu, mig, hami_gpumem, hami_gpucores, cpu_profile, default_quota,
        whole_gpu_product=whole_gpu_product, mig_product=mig_product, hami_scheduler=hami_scheduler,
    )  # fmt: skip
    singleuser: dict[str, Any] = {
        "profileList": profiles,
        "extraEnv": {
            # kernels started by nbclient/papermill in a terminal get quotas too
            "JUPYTER_DEFAULT_PROVISIONER_NAME": "gpushare-provisioner",
        },
        "extraFiles": {
            "jupyter-gpushare": {"mountPath": config_path, "data": pod_config(default_quota, card_headroom)},
        },
    }
    if hami_gpumem:
        # The chart blocks the cloud metadata server with a privileged init container, and HAMi's
        # webhook (v2.10+) refuses a GPU pod with any privileged container. The chart's NetworkPolicy
        # blocks that server too (egressAllowRules.cloudMetadataServer: false, said here explicitly).
        singleuser["cloudMetadata"] = {"blockWithIptables": False}
        singleuser["networkPolicy"] = {"egressAllowRules": {"cloudMetadataServer": False}}
    return {"singleuser": singleuser}


def dump(values: dict[str, Any], fmt: str = "yaml") -> str:
    """YAML (PyYAML when installed; JSON otherwise, which is YAML too) or JSON text."""
    if fmt == "yaml":
        try:
            import yaml
        except ImportError:
            return json.dumps(values, indent=2)
        return yaml.safe_dump(values, sort_keys=False, default_flow_style=False)
    return json.dumps(values, indent=2)
