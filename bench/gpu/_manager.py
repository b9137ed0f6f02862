"""What the GPU checks that start kernels without a Jupyter server share: the card they describe, the
quota manager and the provisioner."""

from __future__ import annotations

import datetime
import os
import platform
from importlib.metadata import EntryPoint

from jupyter_client.provisioning import KernelProvisionerFactory

from jupyter_gpushare.core.policy import Policy, Size
from jupyter_gpushare.host.gpu import GpuBackend
from jupyter_gpushare.server.manager import QuotaManager, use_in_process

SMOKE = os.environ.get("GPUSHARE_CHECK_SMOKE") == "1"  # the plumbing only, on a simulated card, no GPU


def check_header(what: str, quota_mib: int, reserve_mib: int, total_if_smoke: int = 81920) -> tuple:
    """Card 0's NVML handle (None in a SMOKE run), its UUID, and the head of a check's result: what ran,
    when, on which card and driver, with which quota."""
    if SMOKE:
        handle = uuid = driver = None
        device, total = "none (smoke run of the plumbing on a simulated card)", total_if_smoke
    else:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid, device = (_text(f(handle)) for f in (pynvml.nvmlDeviceGetUUID, pynvml.nvmlDeviceGetName))
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
    head = {
        "what": what,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "driver": driver,
        "card_total_mib": total,
        "python": platform.python_version(),
        "quota_mib": quota_mib,
        "context_reserve_mib": reserve_mib,
    }
    return handle, uuid, head


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def install_quota_manager(backend: GpuBackend, quota_mib: int, reserve_mib: int) -> QuotaManager:
    """This process's QuotaManager (ledger in $JUPYTER_DATA_DIR), with the gpushare provisioner as
    jupyter_client's default, registered here so that no installed entry point is needed."""
    policy = Policy(default_quota=Size(mib=quota_mib), context_reserve_mib=reserve_mib, on_full="reject")
    manager = QuotaManager(policy, backend, os.path.join(os.environ.get("JUPYTER_DATA_DIR", "/tmp"), "ledger.sqlite"))
    use_in_process(manager)
    factory = KernelProvisionerFactory.instance()
    factory.provisioners["gpushare-provisioner"] = EntryPoint(
        name="gpushare-provisioner",
        value="jupyter_gpushare.launch.provisioner:GpuShareProvisioner",
        group="jupyter_client.kernel_provisioners",
    )
    factory.default_provisioner_name = "gpushare-provisioner"
    return manager
