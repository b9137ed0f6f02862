"""Kubernetes: generated Zero-to-JupyterHub profiles, and a pod's card capacity under HAMi."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from traitlets.config import Config

from jupyter_gpushare.cli.k8s import apply_pod_limits, dump, parse_hami_limit, profile_list, z2jh_values
from jupyter_gpushare.config.settings import GpuShareApp
from jupyter_gpushare.core.policy import PolicyError
from jupyter_gpushare.host.gpu import Card, DeviceSample, ProcessSample
from jupyter_gpushare.host.gpu.pod import limit_samples, pod_limit_mib

H100 = Card(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559)
L4 = Card(1, "GPU-b", "NVIDIA L4", 23034)


@pytest.mark.parametrize(
    "text, mib", [("8000m", 8000), ("8000M", 8000), ("1g", 1024), ("2G", 2048), ("1073741824", 1024), ("524288k", 512)]
)
def test_hami_limit_units(text, mib):
    assert parse_hami_limit(text) == mib


@pytest.mark.parametrize("text", ["", "lots", "8 GiB", "-1m", "0"])
def test_hami_limit_malformed_is_no_limit(text):
    assert parse_hami_limit(text) is None


def test_pod_limits_per_device_then_for_all():
    env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "8000m", "CUDA_DEVICE_MEMORY_LIMIT": "4g"}
    a, b = apply_pod_limits([H100, L4], env)
    assert (a.total_mib, b.total_mib) == (8000, 4096)
    assert (a.uuid, a.name, a.index) == (H100.uuid, H100.name, 0)  # only the capacity changes


def test_pod_limits_never_raise_capacity_and_absent_means_whole_device():
    assert apply_pod_limits([L4], {"CUDA_DEVICE_MEMORY_LIMIT_1": "100g"}) == [L4]
    assert apply_pod_limits([H100, L4], {}) == [H100, L4]


def test_pod_limit_per_device_then_for_all_then_none():
    env = {"CUDA_DEVICE_MEMORY_LIMIT_1": "bad", "CUDA_DEVICE_MEMORY_LIMIT": "2g"}
    assert [pod_limit_mib(i, env) for i in (0, 1)] == [2048, 2048]
    assert pod_limit_mib(0, {"CUDA_DEVICE_MEMORY_LIMIT_0": "8000m"}) == 8000
    assert pod_limit_mib(0, {}) is None


def test_samples_of_a_hami_share_read_from_the_whole_card_are_not_the_pods():
    """Without HAMi-core's NVML hook, NVML shows the physical card: other pods' memory is not this share's use."""
    (share,) = apply_pod_limits([L4], {"CUDA_DEVICE_MEMORY_LIMIT_1": "8000m"})
    physical = DeviceSample(
        card=share, total_mib=L4.total_mib, used_mib=12000, free_mib=L4.total_mib - 12000, utilization=40.0,
        processes=(ProcessSample(4242, 12000),),
    )  # fmt: skip
    (seen,) = limit_samples([physical])
    assert (seen.total_mib, seen.used_mib, seen.free_mib, seen.processes) == (8000, None, None, ())
    assert "not this pod's 8000 MiB share" in seen.errors["memory"] and seen.errors["processes"]
    assert (seen.card, seen.utilization) == (share, 40.0)
    # HAMi-core's hook loaded: NVML reports the share itself; a whole GPU or a MIG instance: the card itself
    hooked = DeviceSample(card=share, total_mib=8000, used_mib=3000, free_mib=5000, processes=(ProcessSample(7, 3000),))
    whole = DeviceSample(card=H100, total_mib=H100.total_mib, used_mib=100, free_mib=H100.total_mib - 100)
    assert limit_samples([hooked, whole]) == [hooked, whole]


def test_profiles_ask_the_scheduler_for_each_slice_kind():
    profiles = profile_list(whole_gpu=True, mig=["1g.10gb", "3g.40gb"], hami_gpumem=[8000], hami_gpucores=30)
    limits = {p["slug"]: p["kubespawner_override"].get("extra_resource_limits") for p in profiles}
    assert limits == {
        "cpu": None,
        "gpu-whole": {"nvidia.com/gpu": "1"},
        "gpu-mig-1g-10gb": {"nvidia.com/mig-1g.10gb": "1"},
        "gpu-mig-3g-40gb": {"nvidia.com/mig-3g.40gb": "1"},
        "gpu-hami-8000m": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "30"},
    }
    assert [p.get("default", False) for p in profiles] == [True, False, False, False, False]
    assert all(p["display_name"] and p["description"] for p in profiles)
    assert len({p["slug"] for p in profiles}) == len(profiles)


def test_values_carry_a_pod_config_that_the_extension_accepts():
    values = z2jh_values(hami_gpumem=[8000], cpu_profile=False, default_quota="50%")
    single = values["singleuser"]
    assert [p["slug"] for p in single["profileList"]] == ["gpu-hami-8000m"]
    assert single["extraEnv"]["JUPYTER_DEFAULT_PROVISIONER_NAME"] == "gpushare-provisioner"
    (extra,) = single["extraFiles"].values()
    assert extra["mountPath"].endswith(".json")
    policy = GpuShareApp(config=Config(extra["data"])).build_policy()  # what the server in the pod will load
    assert policy.default_quota.percent == 50
    assert extra["data"]["GpuShareApp"]["ledger_path"].startswith("/tmp/")  # pod-local disk, not an NFS home


@pytest.mark.parametrize(
    "kwargs, expect",
    [
        ({"mig": ["big"]}, "not a MIG profile"),
        ({"hami_gpumem": [0]}, "not a memory size"),
        ({"hami_gpumem": [8000], "hami_gpucores": 150}, "not a percentage"),
        ({}, "at least one GPU profile"),
        ({"whole_gpu": True, "default_quota": "4"}, "add a unit"),
    ],
)
def test_bad_arguments_are_named(kwargs, expect):
    with pytest.raises(PolicyError, match=expect):
        z2jh_values(**kwargs)


def test_cli_prints_yaml_and_json_of_the_same_values():
    args = [
        sys.executable,
        "-m",
        "jupyter_gpushare.cli.main",
        "k8s-profiles",
        "--whole-gpu",
        "--mig",
        "1g.10gb",
        "--hami-gpumem",
        "8000",
    ]
    as_json = subprocess.run([*args, "--format", "json"], capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    expected = z2jh_values(whole_gpu=True, mig=["1g.10gb"], hami_gpumem=[8000])
    assert json.loads(as_json.stdout) == expected
    yaml = pytest.importorskip("yaml")
    as_yaml = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert yaml.safe_load(as_yaml.stdout) == expected == yaml.safe_load(dump(expected))
    assert "&id" not in as_yaml.stdout  # each profile has lists of its own: no YAML anchors to untangle
    bad = subprocess.run([*args[:4], "--mig", "huge"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'huge' is not a MIG profile" in bad.stderr


def test_the_nvml_backend_reports_a_hami_pods_share_not_the_whole_card(monkeypatch):
    """Inside a HAMi pod NVML shows the whole card; the ledger must divide only the pod's slice."""
    from types import SimpleNamespace

    import pynvml

    from jupyter_gpushare.host.gpu.fake import FakeNvml
    from jupyter_gpushare.host.gpu.nvml import NvmlBackend

    fake = FakeNvml([81920])
    module = SimpleNamespace(
        **{n: getattr(fake, n) for n in dir(fake) if n.startswith("nvml")}, NVMLError=pynvml.NVMLError
    )
    monkeypatch.setitem(__import__("sys").modules, "pynvml", module)  # the real-driver path imports pynvml
    monkeypatch.setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "8000m")
    (card,) = NvmlBackend().cards()
    assert card.total_mib == 8000
    monkeypatch.delenv("CUDA_DEVICE_MEMORY_LIMIT_0")
    assert NvmlBackend().cards()[0].total_mib == 81920
