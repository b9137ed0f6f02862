"""User pods as Zero-to-JupyterHub and KubeSpawner make them, offline: values -> Hub config -> pod manifest.

KubeSpawner itself renders each pod: it is built by JupyterHub's own ``User`` (over an in-memory Hub
database), the profile is chosen through the spawn form as the Hub does it, and ``get_pod_manifest()``
gives the V1Pod the Hub would send. No cluster is contacted: the Kubernetes client is configured from
a kubeconfig naming an address nothing listens on, and creating a client sends nothing.

:func:`hub_config` is the part of Zero-to-JupyterHub's ``jupyterhub/files/hub/jupyterhub_config.py``
that turns the ``singleuser`` and ``scheduling`` values this project writes or relies on into
KubeSpawner config, over the chart's defaults (``jupyterhub/values.yaml``, chart 4.x).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User
from jupyterhub.utils import maybe_future
from kubernetes_asyncio.client import ApiClient, V1Capabilities, V1Container, V1SecurityContext
from kubespawner import KubeSpawner
from traitlets.config import Config

# The chart's defaults for the keys hub_config() reads (zero-to-jupyterhub-k8s jupyterhub/values.yaml).
CHART_DEFAULTS: dict[str, Any] = {
    "singleuser": {
        "cmd": "jupyterhub-singleuser",
        "image": {"name": "quay.io/jupyterhub/k8s-singleuser-sample", "tag": "4.3.0"},
        "uid": 1000,
        "fsGid": 100,
        "memory": {"guarantee": "1G"},
        "extraEnv": {},
        "extraFiles": {},
        "extraLabels": {"hub.jupyter.org/network-access-hub": "true"},
        "extraTolerations": [],
        "cloudMetadata": {"blockWithIptables": True, "ip": "169.254.169.254"},
        "networkPolicy": {"enabled": True, "egressAllowRules": {"cloudMetadataServer": False}},
        "profileList": [],
    },
    "scheduling": {
        "userScheduler": {"enabled": True},
        "userPods": {
            "tolerations": [
                {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
                {"key": "hub.jupyter.org_dedicated", "operator": "Equal", "value": "user", "effect": "NoSchedule"},
            ],
            "nodeAffinity": {"matchNodePurpose": "prefer"},
        },
    },
}
USER_SCHEDULER = "user-scheduler"  # the chart's get_name("user-scheduler") with no fullnameOverride


def helm_merge(base: Any, over: Any) -> Any:
    """Values over defaults as Helm coalesces them: maps merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = copy.deepcopy(base)
        for key, value in over.items():
            out[key] = helm_merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def hub_config(values: dict[str, Any]) -> Config:
    """The KubeSpawner config the chart's jupyterhub_config.py builds from ``values`` (merged over the
    chart's defaults), for the settings a user pod's manifest shows."""
    v = helm_merge(CHART_DEFAULTS, values)
    su, scheduling = v["singleuser"], v["scheduling"]
    c = Config()
    c.KubeSpawner.cmd = su["cmd"]
    c.KubeSpawner.image = f"{su['image']['name']}:{su['image']['tag']}"
    c.KubeSpawner.uid = su["uid"]
    c.KubeSpawner.fs_gid = su["fsGid"]
    c.KubeSpawner.mem_guarantee = su["memory"]["guarantee"]
    c.KubeSpawner.environment = su["extraEnv"]
    c.KubeSpawner.extra_labels = su["extraLabels"]
    c.KubeSpawner.profile_list = su["profileList"]
    c.KubeSpawner.tolerations = scheduling["userPods"]["tolerations"] + su["extraTolerations"]
    if scheduling["userScheduler"]["enabled"]:
        c.KubeSpawner.scheduler_name = USER_SCHEDULER
    if scheduling["userPods"]["nodeAffinity"]["matchNodePurpose"] == "prefer":
        term = {"matchExpressions": [{"key": "hub.jupyter.org/node-purpose", "operator": "In", "values": ["user"]}]}
        c.KubeSpawner.node_affinity_preferred = [{"weight": 100, "preference": term}]
    if su["cloudMetadata"]["blockWithIptables"]:
        c.KubeSpawner.init_containers = [
            V1Container(
                name="block-cloud-metadata",
                image="quay.io/jupyterhub/k8s-network-tools:4.3.0",
                command=["iptables", "--append", "OUTPUT", "--protocol", "tcp", "--destination",
                         su["cloudMetadata"]["ip"], "--destination-port", "80", "--jump", "DROP"],
                security_context=V1SecurityContext(
                    privileged=True, run_as_user=0, capabilities=V1Capabilities(add=["NET_ADMIN"])
                ),
            )
        ]  # fmt: skip
    if su["extraFiles"]:  # a Secret named "singleuser" holds each file under its key
        items = [{"key": key, "path": key} for key in su["extraFiles"]]
        c.KubeSpawner.volumes = {"files": {"name": "files", "secret": {"secretName": "singleuser", "items": items}}}
        c.KubeSpawner.volume_mounts = {
            f"{i}-files": {"mountPath": f["mountPath"], "subPath": key, "name": "files"}
            for i, (key, f) in enumerate(su["extraFiles"].items())
        }
    return c


def secret_files(values: dict[str, Any]) -> dict[str, str]:
    """The chart's "singleuser" Secret: each extraFiles entry's text, its ``data`` written in the format its
    mountPath names (JSON for .json: the only one this project writes)."""
    out = {}
    for key, f in values["singleuser"].get("extraFiles", {}).items():
        assert f["mountPath"].endswith(".json"), f["mountPath"]
        out[key] = json.dumps(f["data"])
    return out


def write_kubeconfig(path: Path) -> Path:
    """A kubeconfig for a cluster at an address nothing listens on (creating clients contacts nothing)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "offline", "user": {"token": "unused"}}],
                "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "offline", "namespace": "jhub"}}],
                "current-context": "offline",
            }
        )
    )  # fmt: skip
    return path


class Rendered:
    """One user pod: the manifest as the API server would receive it (JSON), and the spawn form."""

    def __init__(self, manifest: dict[str, Any], form: str, spawner: KubeSpawner):
        self.manifest = manifest
        self.form = form
        self.spawner = spawner

    @property
    def spec(self) -> dict[str, Any]:
        return self.manifest["spec"]

    @property
    def container(self) -> dict[str, Any]:
        (notebook,) = [c for c in self.spec["containers"] if c["name"] == "notebook"]
        return notebook

    @property
    def env(self) -> dict[str, str]:
        return {e["name"]: e.get("value") for e in self.container.get("env") or []}

    @property
    def limits(self) -> dict[str, str]:
        return dict((self.container.get("resources") or {}).get("limits") or {})

    @property
    def requests(self) -> dict[str, str]:
        return dict((self.container.get("resources") or {}).get("requests") or {})


@functools.lru_cache(maxsize=1)
def _hub_db() -> Any:
    """An in-memory Hub database (one per test process: creating one takes a tenth of a second)."""
    return orm.new_session_factory("sqlite://")()


async def _render(config: Config, slug: str, name: str) -> Rendered:
    db = _hub_db()
    orm_user = orm.User.find(db, name)
    if orm_user is None:
        orm_user = orm.User(name=name)
        db.add(orm_user)
        db.commit()
    settings = {"spawner_class": KubeSpawner, "config": config, "hub": Hub(), "base_url": "/"}
    spawner = User(orm_user, settings=settings, db=db).spawner  # built by the Hub's own User._new_spawner
    spawner.api_token = "not-a-real-token"  # User.spawn issues one
    # The student picks a profile in the spawn form; the Hub turns the form into user_options, and
    # KubeSpawner applies the profile's kubespawner_override when it starts the server.
    form = await spawner.get_options_form()
    spawner.user_options = await maybe_future(spawner.run_options_from_form({"profile": [slug]}))
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    async with ApiClient() as api:
        manifest = api.sanitize_for_serialization(pod)
    return Rendered(manifest, form, spawner)


def render(values: dict[str, Any], slug: str, user: str = "student1") -> Rendered:
    """The pod KubeSpawner makes for ``user`` choosing profile ``slug`` of a Hub configured from ``values``.
    Raises what KubeSpawner raises for a profile it rejects."""
    return asyncio.run(_render(hub_config(values), slug, user))


def pod_env(rendered: Rendered) -> dict[str, str]:
    """The notebook container's environment as the manifest sets it (values only; none comes from elsewhere)."""
    return {k: v for k, v in rendered.env.items() if v is not None}


_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_resource_name(name: str) -> bool:
    """Whether the API server accepts ``name`` as an extended resource (apimachinery's IsQualifiedName:
    a DNS subdomain prefix, '/', and a name of at most 63 characters)."""
    prefix, _, base = name.rpartition("/")
    return bool(prefix and _DNS_SUBDOMAIN.match(prefix) and len(base) <= 63 and _QUALIFIED_NAME.match(base))
