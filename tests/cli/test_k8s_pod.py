"""Inside a user pod the slice is the card: the real server, with the environment and config a pod gets.

Each pod is rendered by KubeSpawner from the generated values (tests/k8s_pods.py); a `jupyter server` then
runs with that pod's environment, the device plugin's additions (HAMi's memory limit variables, or the one
MIG instance the NVIDIA device plugin hands over) and the settings file the chart mounts, over the fake
NVML of jupyter_gpushare/host/gpu/fake.py standing in for the pod's driver: under HAMi it shows the whole
physical card (as the driver does where HAMi-core's NVML hook is not loaded), under MIG the GPU in MIG mode
with only the pod's instance. What must hold: the cards the API and the sidebar get, each kernel's quota
and the admission limits, and `jupyter gpushare doctor`, all count the slice's memory, never the card's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.error
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubespawner", reason="pip install jupyterhub-kubespawner (in the test extras)")

import kubernetes_asyncio.config.kube_config as kube_config  # noqa: E402
from k8s_pods import pod_env, render, secret_files, write_kubeconfig  # noqa: E402
from servers import ServerProcess, wait_until  # noqa: E402

from jupyter_gpushare.cli.k8s import z2jh_values  # noqa: E402
from jupyter_gpushare.core.policy import format_mib  # noqa: E402

pytestmark = pytest.mark.server  # starts jupyter servers as processes (README: the quick subset)

VALUES = z2jh_values(mig=["1g.10gb"], hami_gpumem=[8000], hami_gpucores=30, cpu_profile=False, default_quota="20%")
L4_MIB = 23034  # an NVIDIA L4 as NVML reports it
H100_MIB = 81559  # an NVIDIA H100 80GB HBM3 as NVML reports it
MIG_1G_10GB_MIB = 9856  # about what one 1g.10gb instance offers; it only has to differ from the GPU's memory
OTHER_PODS_MIB = 12000  # what other pods' HAMi shares hold on the same L4

# This process's NVML becomes the fake NVML, as a pod's driver shows it (test only: on PYTHONPATH, for the
# server and the doctor; it removes its variable, so the server's kernels run without it).
SITECUSTOMIZE = textwrap.dedent(
    """
    import json, os

    _spec = os.environ.pop("GPUSHARE_TEST_FAKE_NVML", None)
    if _spec:
        import pynvml
        from jupyter_gpushare.host.gpu.fake import FakeNvml

        _spec = json.loads(_spec)
        _fake = FakeNvml(_spec["sizes_mib"], name=_spec["name"], uuid_prefix="GPU-pod-")
        for _card, _slots in _spec.get("mig", {}).items():
            _fake.enable_mig(int(_card), _slots)
        for _card, _mib in _spec.get("driver_used_mib", {}).items():
            _fake.devices[int(_card)].driver_used_mib = _mib
        for _name in dir(_fake):
            if _name.startswith("nvml"):
                setattr(pynvml, _name, getattr(_fake, _name))
        pynvml.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    """
)


def _hami_device_plugin_env(limits: dict[str, str]) -> dict[str, str]:
    """What HAMi's device plugin adds to a container it allocates one GPU to (HAMi
    pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go, Allocate): the pod's share per device."""
    return {
        "NVIDIA_VISIBLE_DEVICES": "GPU-pod-0",
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{limits['nvidia.com/gpumem']}m",
        "CUDA_DEVICE_SM_LIMIT": limits.get("nvidia.com/gpucores", "0"),
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/pod.cache",
    }


SCENARIOS: dict[str, dict[str, Any]] = {
    "hami": {
        "slug": "gpu-hami-8000m",
        "nvml": {"sizes_mib": [L4_MIB], "name": "NVIDIA L4", "driver_used_mib": {"0": OTHER_PODS_MIB}},
        "physical_mib": L4_MIB,
    },
    "mig": {
        "slug": "gpu-mig-1g-10gb",
        # NVML in the pod: GPU 0 in MIG mode, only the instance in slot 2 (GPU instance 3) given to this pod
        "nvml": {"sizes_mib": [H100_MIB], "name": "NVIDIA H100 80GB HBM3", "mig": {"0": [None, None, MIG_1G_10GB_MIB]}},
        "physical_mib": H100_MIB,
        "slice_mib": MIG_1G_10GB_MIB,
    },
}


class PodServer(ServerProcess):
    """`jupyter server` as the single-user server of one pod."""

    def __init__(self, base: Path, env: dict[str, str], ledger: Path):
        root = base / "root"
        root.mkdir()
        self.launch(base, ["--allow-root", f"--ServerApp.root_dir={root}"], {"ledger_path": str(ledger)}, env=env)


def _pod_files(base: Path) -> Path:
    """The chart's Secret mounted as the pod's /etc/jupyter/jupyter_server_config.json: its directory."""
    ((key, text),) = secret_files(VALUES).items()
    mount = Path(VALUES["singleuser"]["extraFiles"][key]["mountPath"])
    etc = base / "etc-jupyter"
    etc.mkdir()
    (etc / mount.name).write_text(text)
    return etc


def _environment(base: Path, scenario: dict[str, Any]) -> tuple[dict[str, str], int]:
    """The server's environment: this host's (PATH, the Python), then the pod's as rendered, then the device
    plugin's; the Jupyter config path holds the mounted settings file. Returns it with the slice in MiB."""
    pod = render(VALUES, scenario["slug"])
    env = {**os.environ, **pod_env(pod)}
    if scenario["slug"].startswith("gpu-hami"):
        env.update(_hami_device_plugin_env(pod.limits))
        slice_mib = int(pod.limits["nvidia.com/gpumem"])  # HAMi's MiB, which its limit variable carries
    else:
        (resource,) = pod.limits  # the one MIG instance it asked for: NVML in the pod shows only that one
        assert resource == "nvidia.com/mig-1g.10gb"
        env["NVIDIA_VISIBLE_DEVICES"] = "MIG-GPU-pod-0-2"
        slice_mib = scenario["slice_mib"]
    shim = base / "site"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p),
        GPUSHARE_TEST_FAKE_NVML=json.dumps(scenario["nvml"]),
        JUPYTER_CONFIG_PATH=str(_pod_files(base)),
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_DATA_DIR=str(base / "data"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
    )
    return env, slice_mib


@pytest.fixture(scope="module", params=list(SCENARIOS))
def pod(request, tmp_path_factory):
    """One pod's server with one kernel started, and what the API and the doctor said about it."""
    scenario = SCENARIOS[request.param]
    base = tmp_path_factory.mktemp(request.param)
    kubeconfig = write_kubeconfig(base / "kubeconfig")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        env, slice_mib = _environment(base, scenario)
    ledger = base / "ledger" / "ledger.sqlite"  # the pod's /tmp/jupyter-gpushare is this host's /tmp here
    server = PodServer(base, env, ledger)
    try:
        server.wait_ready()
        seen: dict[str, Any] = {"slice_mib": slice_mib, "physical_mib": scenario["physical_mib"], "kind": request.param}
        seen["cards_before"] = server.call("GET", "api/gpushare/cards")
        kernel_id = server.call("POST", "api/kernels", {"name": "python3"})["id"]

        def running() -> dict | None:
            rows = server.call("GET", "api/gpushare/kernels")["kernels"]
            return next((k for k in rows if k["kernel_id"] == kernel_id and k["state"] == "running"), None)

        seen["kernel"] = wait_until(running, 60, "the kernel to run on its quota")
        seen["cards"] = server.call("GET", "api/gpushare/cards")
        seen["host"] = server.call("GET", "api/gpushare/host")
        seen["config"] = server.call("GET", "api/gpushare/config")
        try:
            server.call("PATCH", f"api/gpushare/kernels/{kernel_id}", {"quota": f"{slice_mib}MiB"})
            seen["whole_slice"] = None
        except urllib.error.HTTPError as e:
            seen["whole_slice"] = (e.code, json.loads(e.read()).get("message", ""))
        override = base / "ledger.json"  # the doctor reads the same config; only the ledger moves, as above
        override.write_text(json.dumps({"GpuShareApp": {"ledger_path": str(ledger)}}))
        doctor = subprocess.run(
            [sys.executable, "-m", "jupyter_gpushare.cli.main", "doctor", "--json", "--config", str(override)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        seen["doctor"] = {f["check"]: f for f in json.loads(doctor.stdout)}
        server.call("DELETE", f"api/kernels/{kernel_id}")
        yield seen
    finally:
        server.stop()


def test_the_card_is_the_slice(pod):
    """The card the sidebar is served (GET /cards and /host) has the slice's memory, before and after a kernel."""
    slice_mib = pod["slice_mib"]
    assert slice_mib < pod["physical_mib"]
    headroom = pod["config"]["card_headroom"]
    headroom = headroom["mib"] if "mib" in headroom else int(slice_mib * headroom["percent"] / 100)
    for reply in (pod["cards_before"], pod["cards"], pod["host"]):
        (card,) = reply["cards"]
        assert card["total_mib"] == slice_mib, card
        assert card["usable_mib"] == slice_mib - headroom
    (card,) = pod["cards"]["cards"]
    if pod["kind"] == "mig":
        assert card["uuid"].startswith("MIG-") and card["label"].startswith("GPU 0 MIG "), card
    assert card["reserved_mib"] == pod["kernel"]["reserved_mib"]
    assert card["unreserved_mib"] == slice_mib - headroom - pod["kernel"]["reserved_mib"]


def test_a_kernels_quota_is_a_share_of_the_slice(pod):
    slice_mib = pod["slice_mib"]
    kernel, config = pod["kernel"], pod["config"]
    assert config["default_quota"] == {"percent": 20}  # from the settings file the chart mounts
    assert kernel["quota_mib"] == int(slice_mib * 20 / 100), kernel
    assert kernel["reserved_mib"] == kernel["quota_mib"] + config["context_reserve_mib"]
    assert kernel["card"]["total_mib"] == slice_mib


def test_a_quota_the_slice_cannot_hold_is_refused(pod):
    """The whole slice as one kernel's quota does not fit beside the context reserve, on a card many times bigger."""
    assert pod["whole_slice"] is not None, "the whole slice was accepted as one kernel's quota"
    status, message = pod["whole_slice"]
    most = pod["cards"]["cards"][0]["usable_mib"] - pod["config"]["context_reserve_mib"]
    assert status == 400 and f"the most a kernel can reserve here is {format_mib(most)}" in message, message


def test_the_doctor_reports_the_slice(pod):
    cards = pod["doctor"]["cards"]
    assert cards["status"] == "ok", cards
    assert format_mib(pod["slice_mib"]) in cards["detail"], cards
    assert format_mib(pod["physical_mib"]) not in cards["detail"], cards


def test_measured_figures_stay_within_the_slice(pod):
    """What the driver measures is shown against the slice: no more used or free than the slice holds."""
    (card,) = pod["cards"]["cards"]
    over = {f: card[f] for f in ("used_mib", "free_mib", "used_by_others_mib") if (card[f] or 0) > card["total_mib"]}
    assert over == {}, card
