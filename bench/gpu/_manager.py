"""The quota manager and provisioner for the GPU checks that start kernels without a Jupyter server."""

from __future__ import annotations

import os
from importlib.metadata import EntryPoint

from jupyter_client.provisioning import KernelProvisionerFactory

from jupyter_gpushare.gpu import GpuBackend
from jupyter_gpushare.manager import QuotaManager
from jupyter_gpushare.policy import Policy, Size


def install_quota_manager(backend: GpuBackend, quota_mib: int, reserve_mib: int) -> QuotaManager:
    """This process's QuotaManager (ledger in $JUPYTER_DATA_DIR), with the gpushare provisioner as
    jupyter_client's default, registered here so that no installed entry point is needed."""
    policy = Policy(default_quota=Size(mib=quota_mib), context_reserve_mib=reserve_mib, on_full="reject")
    manager = QuotaManager(policy, backend, os.path.join(os.environ.get("JUPYTER_DATA_DIR", "/tmp"), "ledger.sqlite"))
    QuotaManager.install(manager)
    factory = KernelProvisionerFactory.instance()
    factory.provisioners["gpushare-provisioner"] = EntryPoint(
        name="gpushare-provisioner",
        value="jupyter_gpushare.provisioner:GpuShareProvisioner",
        group="jupyter_client.kernel_provisioners",
    )
    factory.default_provisioner_name = "gpushare-provisioner"
    return manager
