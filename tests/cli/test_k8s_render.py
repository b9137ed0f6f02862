"""Kubernetes, against the real spawner: every generated profile, rendered into a pod by KubeSpawner itself.

The values `jupyter gpushare k8s-profiles` writes go through Zero-to-JupyterHub's config (tests/k8s_pods.py),
a student picks each profile in the spawn form, and KubeSpawner renders the pod offline. What must hold:
each pod asks the scheduler for the slice its profile promises, under the resource name the device plugin
advertises; lands on the nodes that have it and tolerates their taint; gets past HAMi's admission webhook
where HAMi runs; runs the single-user server with the extension, its settings and its provisioner. A
profile whose override KubeSpawner ignores (a misspelled trait) or rejects fails here.
"""

from __future__ import annotations

import html
import json
import os
import re
from importlib.metadata import entry_points
from typing import Any

import pytest

pytest.importorskip("kubespawner", reason="pip install jupyterhub-kubespawner (in the test extras)")

import kubernetes_asyncio.config.kube_config as kube_config  # noqa: E402
from jupyter_core.paths import SYSTEM_CONFIG_PATH  # noqa: E402
from k8s_pods import (  # noqa: E402
    CHART_DEFAULTS,
    USER_SCHEDULER,
    Rendered,
    is_resource_name,
    render,
    secret_files,
    write_kubeconfig,
)
from kubespawner import KubeSpawner  # noqa: E402
from traitlets.config import Config  # noqa: E402

from jupyter_gpushare.cli.k8s import GPU_MODELS, profile_list, z2jh_values  # noqa: E402
from jupyter_gpushare.config.settings import GpuShareApp  # noqa: E402
from jupyter_gpushare.core.policy import PolicyError  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"  # as nvidia-smi names it
# The worked example of docs/kubernetes.md: a node of H100s (whole, or MIG 1g.10gb), a node of L4s under HAMi.
VALUES = z2jh_values(
    whole_gpu=True, mig=["1g.10gb"], hami_gpumem=[8000], hami_gpucores=30,
    whole_gpu_product=H100, mig_product=H100, default_quota="20%",
)  # fmt: skip
PROFILES = {p["slug"]: p for p in VALUES["singleuser"]["profileList"]}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
CHART_TOLERATIONS = CHART_DEFAULTS["scheduling"]["userPods"]["tolerations"]


def device_plugin_mig_resource(profile: str) -> str:
    """The NVIDIA device plugin's name for a MIG profile's resource, mixed strategy
    (k8s-device-plugin internal/rm/rm.go: strings.ReplaceAll("mig-"+profile, "+", "."))."""
    return "nvidia.com/" + ("mig-" + profile).replace("+", ".")


def gfd_product(name: str) -> str:
    """GPU feature discovery's nvidia.com/gpu.product value for a GPU name (internal/lm/resource.go sanitise)."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", name).split())


@pytest.fixture(scope="module", autouse=True)
def offline_cluster(tmp_path_factory):
    """KubeSpawner loads a kubeconfig when it is built: give it one for a cluster nothing listens at."""
    path = write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
        yield


@pytest.fixture(scope="module")
def pods() -> dict[str, Rendered]:
    return {slug: render(VALUES, slug) for slug in PROFILES}


def with_profile(values: dict[str, Any], slug: str, override: dict[str, Any]) -> dict[str, Any]:
    """``values`` with profile ``slug``'s kubespawner_override replaced."""
    out = json.loads(json.dumps(values))
    for p in out["singleuser"]["profileList"]:
        if p["slug"] == slug:
            p["kubespawner_override"] = override
    return out


def _contains(where: Any, value: Any) -> bool:
    if isinstance(value, dict):
        return isinstance(where, dict) and all(k in where and _contains(where[k], v) for k, v in value.items())
    if isinstance(value, list):
        return isinstance(where, list) and all(any(_contains(w, v) for w in where) for v in value)
    return where == value


# Where each KubeSpawner trait a profile may override shows in the pod (V1Pod as JSON).
LANDS_IN = {
    "extra_resource_limits": lambda pod: pod.limits,
    "node_selector": lambda pod: pod.spec.get("nodeSelector"),
    "tolerations": lambda pod: pod.spec.get("tolerations"),
    "environment": lambda pod: pod.env,
    "extra_labels": lambda pod: pod.manifest["metadata"].get("labels"),
    "scheduler_name": lambda pod: pod.spec.get("schedulerName"),
}


def override_problems(values: dict[str, Any], slug: str) -> list[str]:
    """Why profile ``slug``'s kubespawner_override does not become the pod: a key that is no configurable
    KubeSpawner trait (KubeSpawner sets it as a plain attribute and nothing reads it), a value that is not
    where the trait puts it in the pod, or a key whose removal leaves the pod unchanged."""
    profile = next(p for p in values["singleuser"]["profileList"] if p["slug"] == slug)
    override = profile["kubespawner_override"]
    traits = KubeSpawner.class_traits(config=True)
    problems = [f"{key!r} is not a KubeSpawner trait" for key in override if key not in traits]
    pod = render(values, slug)
    for key, value in override.items():
        if key not in LANDS_IN:
            problems.append(f"{key!r}: this test does not know where it shows in a pod; add it to LANDS_IN")
        elif not _contains(LANDS_IN[key](pod), value):
            problems.append(f"{key!r}: {value!r} is not in the pod ({LANDS_IN[key](pod)!r})")
        without = render(with_profile(values, slug, {k: v for k, v in override.items() if k != key}), slug)
        if without.manifest == pod.manifest:
            problems.append(f"{key!r}: the pod is the same without it")
    return problems


@pytest.mark.parametrize("slug", PROFILES)
def test_every_override_key_is_a_kubespawner_trait_that_shows_in_the_pod(slug):
    assert override_problems(VALUES, slug) == []


def test_a_misspelled_override_key_is_caught_although_kubespawner_ignores_it():
    override = dict(PROFILES["gpu-hami-8000m"]["kubespawner_override"])
    override["schedular_name"] = override.pop("scheduler_name")  # a value that is no dict: set as a plain attribute
    values = with_profile(VALUES, "gpu-hami-8000m", override)
    pod = render(values, "gpu-hami-8000m")  # KubeSpawner takes it without a word ...
    assert pod.spec["schedulerName"] == USER_SCHEDULER  # ... and HAMi would never place the pod
    assert "'schedular_name' is not a KubeSpawner trait" in override_problems(values, "gpu-hami-8000m")


@pytest.mark.parametrize(
    "change, error",
    [
        ({"extra_resource_limit": {"nvidia.com/gpu": "1"}}, "has no attribute 'extra_resource_limit'"),  # a dict
        ({"extra_resource_limits": ["nvidia.com/gpu"]}, "extra_resource_limits"),  # not a dict
    ],
)
def test_a_profile_kubespawner_rejects_fails_to_render(change, error):
    override = {**PROFILES["gpu-whole"]["kubespawner_override"], **change}
    with pytest.raises(Exception, match=error):
        render(with_profile(VALUES, "gpu-whole", override), "gpu-whole")


def test_each_pod_asks_the_scheduler_for_its_slice(pods):
    assert pods["gpu-whole"].limits == {"nvidia.com/gpu": "1"}
    assert pods["gpu-mig-1g-10gb"].limits == {device_plugin_mig_resource("1g.10gb"): "1"}
    assert pods["gpu-hami-8000m"].limits == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "8000",
        "nvidia.com/gpucores": "30",
    }
    assert not [r for r in pods["cpu"].limits if r.startswith("nvidia.com/")]
    for slug, pod in pods.items():
        assert all(is_resource_name(r) for r in pod.limits), (slug, pod.limits)
        # extended resources: the API server sets requests = limits; any request given must equal them
        assert all(pod.requests.get(r, q) == q for r, q in pod.limits.items() if r.startswith("nvidia.com/")), slug


@pytest.mark.parametrize("model", [m for m, spec in GPU_MODELS.items() if spec.mig_profiles])
def test_mig_pods_ask_for_the_resource_the_device_plugin_advertises_on_every_listed_model(model):
    spec = GPU_MODELS[model]
    product = spec.names[0]
    values = z2jh_values(mig=spec.mig_profiles, mig_product=product, cpu_profile=False)
    slugs = [p["slug"] for p in values["singleuser"]["profileList"]]
    assert len(slugs) == len(set(slugs)) == len(spec.mig_profiles)
    for name, slug in zip(spec.mig_profiles, slugs):
        pod = render(values, slug)
        resource = device_plugin_mig_resource(name)
        assert pod.limits == {resource: "1"} and is_resource_name(resource), (name, pod.limits)
        assert pod.spec["nodeSelector"]["nvidia.com/gpu.product"] == gfd_product(product)


def test_a_mig_profile_the_model_does_not_have_is_refused_and_an_unlisted_model_is_trusted():
    with pytest.raises(PolicyError, match=r"NVIDIA A100-SXM4-40GB has no MIG profile '1g\.20gb'; it has 1g\.5gb,"):
        profile_list(mig=["1g.20gb"], mig_product="NVIDIA A100-SXM4-40GB")
    with pytest.raises(PolicyError, match="not a MIG profile"):
        profile_list(mig=["1g.10gb+"], mig_product=H100)
    (profile,) = profile_list(mig=["1g.23gb"], mig_product="NVIDIA B200", cpu_profile=False)
    assert device_plugin_mig_resource("1g.23gb") in profile["kubespawner_override"]["extra_resource_limits"]


def test_gpu_pods_go_to_their_nodes_and_tolerate_them_without_losing_the_charts_tolerations(pods):
    for slug in ("gpu-whole", "gpu-mig-1g-10gb", "gpu-hami-8000m"):
        tolerations = pods[slug].spec["tolerations"]
        assert _contains(tolerations, [*CHART_TOLERATIONS, GPU_TOLERATION]), (slug, tolerations)
    assert pods["cpu"].spec["tolerations"] == CHART_TOLERATIONS  # kept off tainted GPU nodes
    for slug in ("gpu-whole", "gpu-mig-1g-10gb"):
        assert pods[slug].spec["nodeSelector"] == {"nvidia.com/gpu.product": gfd_product(H100)}
    # Whole GPUs and MIG slices come from the NVIDIA device plugin, scheduled as every user pod is;
    # HAMi's webhook would move a pod that asks for nvidia.com/gpu to HAMi's scheduler: it is told not to.
    assert pods["gpu-whole"].spec["schedulerName"] == pods["gpu-mig-1g-10gb"].spec["schedulerName"] == USER_SCHEDULER
    assert pods["gpu-whole"].manifest["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    # A HAMi share is assigned by HAMi's scheduler only (its device plugin refuses pods it did not place).
    assert pods["gpu-hami-8000m"].spec["schedulerName"] == "hami-scheduler"
    assert "nodeSelector" not in pods["gpu-hami-8000m"].spec or not pods["gpu-hami-8000m"].spec["nodeSelector"]


def _privileged(pod: Rendered) -> list[str]:
    return [
        c["name"]
        for c in pod.spec.get("initContainers", []) + pod.spec["containers"]
        if (c.get("securityContext") or {}).get("privileged")
    ]


def test_hami_admits_the_pod_and_the_metadata_block_stays_where_there_is_no_hami(pods):
    # HAMi's webhook (v2.10) denies a pod asking for its resources if any container is privileged,
    # and the chart blocks the cloud metadata server with a privileged init container.
    assert _privileged(pods["gpu-hami-8000m"]) == []
    whole_only = z2jh_values(whole_gpu=True)
    assert _privileged(render(whole_only, "gpu-whole")) == ["block-cloud-metadata"]


def test_each_pod_runs_the_single_user_server_with_the_extension_its_settings_and_its_provisioner(pods):
    (extra_key,) = VALUES["singleuser"]["extraFiles"]
    mount_path = VALUES["singleuser"]["extraFiles"][extra_key]["mountPath"]
    text = secret_files(VALUES)[extra_key]
    config = Config(json.loads(text))
    # the file lands where every Jupyter server reads its config, under the name the server reads
    assert os.path.dirname(mount_path) in SYSTEM_CONFIG_PATH
    assert os.path.basename(mount_path) == "jupyter_server_config.json"
    assert config.ServerApp.jpserver_extensions == {"jupyter_gpushare": True}
    assert str(GpuShareApp(config=config).build_policy().default_quota) == "20%"
    (provisioner,) = entry_points(group="jupyter_client.kernel_provisioners", name="gpushare-provisioner")
    assert provisioner.value == "jupyter_gpushare.launch.provisioner:GpuShareProvisioner"
    (singleuser,) = entry_points(group="console_scripts", name="jupyterhub-singleuser")
    assert singleuser.value == "jupyterhub.singleuser:main"  # a jupyter_server: it loads jpserver_extensions
    for slug, pod in pods.items():
        args = pod.container["args"]
        assert args[0] == "jupyterhub-singleuser", (slug, args)
        assert pod.env["JUPYTER_DEFAULT_PROVISIONER_NAME"] == provisioner.name
        assert "JUPYTERHUB_SINGLEUSER_APP" not in pod.env  # the classic notebook server would load no extension
        (mount,) = [m for m in pod.container["volumeMounts"] if m["mountPath"] == mount_path]
        (volume,) = [v for v in pod.spec["volumes"] if v["name"] == mount["name"]]
        assert {"key": mount["subPath"], "path": mount["subPath"]} in volume["secret"]["items"]
        assert mount["subPath"] == extra_key
        if slug == "cpu":
            assert pod.env["NVIDIA_VISIBLE_DEVICES"] == "void"  # no GPU of the node leaks in
        else:  # the device plugin sets the devices; a value here would fight it
            assert not {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} & set(pod.env), slug


def test_the_spawn_form_offers_every_profile_with_its_description(pods):
    form = pods["cpu"].form
    for profile in PROFILES.values():
        for text in (profile["display_name"], profile["description"]):
            assert html.escape(text) in form, text
        assert f'value="{profile["slug"]}"' in form
