"""The environment a kernel is started with: its card, its quota, and framework knobs."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_client.provisioning import KernelProvisionerFactory

from ..bootstrap import _gpushare_env as names  # the names the bootstrap reads, from the one place
from ..core.addresses import PROVISIONER_NAME
from ..core.history import retry_quota_mib
from ..server.records import Grant

BOOTSTRAP_DIR = Path(__file__).parent.parent / "bootstrap"
PEAK_BEFORE = names.PEAK_BEFORE_MIB  # what earlier runs of the kernel's notebook peaked at (history.py)
# What a grant sets beside the GPUSHARE_* variables: each kernel's own (a warm kernel's hand-over sets them anew)
GRANT_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "CUPY_GPU_MEMORY_LIMIT",
    "TF_FORCE_GPU_ALLOW_GROWTH",
)


def kernel_env(
    grant: Grant,
    kernel_id: str,
    python: bool,
    base: dict[str, str],
    report_dir: str,
    max_quota_mib: int | None = None,
    peak_before_mib: int | None = None,
    learns: bool = False,
) -> dict[str, str]:
    """Variables to add to (or override in) a kernel's environment ``base``.

    GPUSHARE_* tell the in-kernel bootstrap (and any tool) what the kernel got; GPUSHARE_PEAK_BEFORE_MIB (a whole
    number of MiB, set only when its notebook has history) what earlier runs of its notebook peaked at, NVML's
    figure with the CUDA context, for the out-of-memory note, which also offers GPUSHARE_RETRY_QUOTA_MIB (what to
    restart with after running out of memory, at most the largest quota) and, with GPUSHARE_LEARNS=1 (quotas
    learned from history), says that the notebook learns from the failure. Framework knobs that
    are safe in every framework version are set here; version-dependent ones (PyTorch's allocator
    config) are set by the bootstrap, which can see the installed version.
    """
    env = {names.KERNEL_ID: kernel_id, names.MODE: grant.mode, names.REPORT_DIR: report_dir}
    if grant.reason:
        env[names.REASON] = grant.reason
    if peak_before_mib is not None:
        env[PEAK_BEFORE] = str(int(peak_before_mib))
    if python:
        # The stdlib-only bootstrap (sitecustomize -> _gpushare_boot) runs in the kernel and its children.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), base.get("PYTHONPATH", "")) if p)
        # The bootstrap marks the kernel's own process by this variable; a value inherited from the
        # server's environment (a server started from inside another kernel) must not leak in.
        env[names.ROOT_PID] = ""
    if grant.mode != "gpu":
        # Hide every GPU: this kernel holds no reservation (started without a GPU, or its quota is none).
        env["CUDA_VISIBLE_DEVICES"] = ""
    if grant.mode != "gpu" or grant.lease is None or grant.card is None:
        return env
    lease, card = grant.lease, grant.card
    cap_bytes = lease.quota_mib * 2**20
    fraction = f"{lease.quota_mib / card.total_mib:.6f}"
    most = max_quota_mib if max_quota_mib is not None else card.total_mib
    env.update(
        {
            names.RETRY_QUOTA_MIB: str(min(retry_quota_mib(lease.quota_mib), most)),
            names.LEARNS: "1" if learns else "0",
            names.QUOTA_MIB: str(lease.quota_mib),
            names.RESERVE_MIB: str(lease.reserve_mib),
            names.CARD_UUID: card.uuid,
            names.CARD_INDEX: str(card.index),
            names.CARD_NAME: card.name,
            names.CARD_TOTAL_MIB: str(card.total_mib),
            names.SIMULATED: "1" if card.simulated else "0",
            names.TORCH_FRACTION: fraction,
            names.MAX_QUOTA_MIB: str(most),
        }
    )
    env.update(
        # A simulated card has no real memory: the kernel sees no GPU at all.
        CUDA_VISIBLE_DEVICES="" if card.simulated else card.uuid,
        # JAX: no 75% preallocation; its pool is capped at the quota (fractions are of total memory).
        # Only the older name: every jaxlib reads it, and jaxlib 0.11 refuses to start on the GPU when
        # XLA_CLIENT_MEM_FRACTION is set beside it (seen on an H200, bench/results/check_caps-*.json).
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        XLA_PYTHON_CLIENT_MEM_FRACTION=fraction,
        # CuPy: its default pool refuses past the quota.
        CUPY_GPU_MEMORY_LIMIT=str(cap_bytes),
        # TensorFlow: grow lazily inside the logical device the bootstrap sets up.
        TF_FORCE_GPU_ALLOW_GROWTH="true",
    )
    return env


def drop_inherited(env: dict[str, str]) -> None:
    """What a kernel's environment must not inherit from the server's: the server's own notebook history, and our
    provisioner as jupyter_client's default (a kernel of another Python environment, without this package, would find
    no kernelspec at all: jupyter_client hides them all when the default provisioner is missing; a kernel of this
    environment sets it again itself, jupyter_gpushare_provisioner.pth)."""
    env.pop(PEAK_BEFORE, None)
    if env.get(KernelProvisionerFactory.default_provisioner_name_env) == PROVISIONER_NAME:
        del env[KernelProvisionerFactory.default_provisioner_name_env]
