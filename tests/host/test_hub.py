"""Servers in containers: a real JupyterHub, its real proxy, and a broker that knows servers by their Hub tokens.

Container images run every user's server as one Unix user ('jovyan'), in PID namespaces the broker
cannot see into, so neither SO_PEERCRED nor pids can tell users apart or say who is alive. Here a
real JupyterHub (configurable-http-proxy from tests/hub/node_modules) spawns every user's server as
ONE Unix user, and the servers reach the broker over TLS (GpuShareApp.broker_socket = 'tls://...',
GpuShareBroker.tcp_certfile), identified only by their JUPYTERHUB_API_TOKEN. What must hold, as with Unix users (test_broker.py):
host-wide admission and per-user limits (with Hub groups), no releasing, reading or forging another
user's reservations, a Hub admin sees all; a killed server's reservations are reclaimed once its
session expires; a broker restart loses nothing alive. Needs root, Node.js and jupyterhub.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from multiuser import Broker, as_user, ensure_user, remove_user, shared_scratch
from servers import free_port, wait_until
from tls import make_certificates

from jupyter_gpushare.broker import BrokerLedger
from jupyter_gpushare.core.policy import parse_size
from jupyter_gpushare.ledger.ledger import LedgerError, Request

HUB_TESTS = Path(__file__).resolve().parent.parent / "hub"
CHP = HUB_TESTS / "node_modules" / ".bin" / "configurable-http-proxy"
RUN = os.getpid() % 100000
SHARED = f"gsj{RUN}"  # the one Unix user every server runs as ('jovyan' in a container image)
UNIX_HUB_USER = f"gsh{RUN}"  # a Unix user who is also a Hub user in the Hub group (Unix-socket caller)
ALICE, BOB, CAROL = "alice", "bob", "carol"  # Hub users only: no Unix accounts
HUB_GROUP = "gpu-staff"  # a JupyterHub group (no Unix group of that name)
ADMIN_TOKEN, BROKER_TOKEN = f"test-admin-{RUN}-0123456789abcdef", f"broker-{RUN}-0123456789abcdef"
TTL = 3.0

needs_hub = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("node") or not shutil.which("npm"),
    reason="needs root and useradd (servers as another Unix user), Node.js and npm (configurable-http-proxy)",
)


def _chp() -> Path:
    if not CHP.exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HUB_TESTS, check=True, timeout=600)
    return CHP


class Hub:
    """A `jupyterhub` whose spawner runs every user's server as one Unix user, with homes of their own."""

    def __init__(self, base: Path, broker_address: str, ca_file: Path, shared: str):
        pytest.importorskip("jupyterhub", reason="pip install jupyterhub (in the test extras)")
        self.base, self.port, self.hub_port = base, free_port(), free_port()
        self.homes = base / "homes"
        self.homes.mkdir()
        settings = [
            f"--GpuShareApp.broker_socket={broker_address}", f"--GpuShareApp.broker_ca_file={ca_file}",
            "--GpuShareApp.gpu_backend=simulated",
            "--GpuShareApp.simulated_cards=10GiB", "--GpuShareApp.card_headroom=0MiB",
            "--GpuShareApp.context_reserve=512MiB", "--GpuShareApp.default_quota=2GiB",
            "--GpuShareApp.reconcile_interval=0.5", "--GpuShareApp.on_full=reject",
        ]  # fmt: skip
        (base / "jupyterhub_config.py").write_text(
            textwrap.dedent(
                f"""
                import sys
                from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid

                class SameUidSpawner(LocalProcessSpawner):
                    # every server as {shared!r}, as container images run everyone as one user
                    def make_preexec_fn(self, name):
                        return set_user_setuid({shared!r})

                    def user_env(self, env):
                        home = {str(self.homes)!r} + "/" + self.user.name
                        env.update(HOME=home, USER={shared!r}, JUPYTER_DATA_DIR=home + "/data",
                                   JUPYTER_RUNTIME_DIR=home + "/runtime", IPYTHONDIR=home + "/ipython")
                        return env

                c.JupyterHub.spawner_class = SameUidSpawner
                c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
                c.Spawner.args = {settings!r}
                c.Spawner.notebook_dir = {str(self.homes)!r} + "/{{username}}"
                c.JupyterHub.authenticator_class = "dummy"
                c.Authenticator.allowed_users = {{{ALICE!r}, {BOB!r}, {UNIX_HUB_USER!r}, "root"}}
                c.Authenticator.admin_users = {{{CAROL!r}}}
                c.JupyterHub.load_groups = {{{HUB_GROUP!r}: {{"users": [{BOB!r}, {UNIX_HUB_USER!r}]}}}}
                c.JupyterHub.services = [
                    {{"name": "gpushare-broker", "api_token": {BROKER_TOKEN!r}}},
                    {{"name": "test-admin", "api_token": {ADMIN_TOKEN!r}}},
                ]
                c.JupyterHub.load_roles = [
                    {{"name": "gpushare-broker", "scopes": ["read:users:name", "read:users:groups"],
                      "services": ["gpushare-broker"]}},
                    {{"name": "admin", "services": ["test-admin"]}},
                ]
                c.JupyterHub.bind_url = "http://127.0.0.1:{self.port}"
                c.JupyterHub.hub_bind_url = "http://127.0.0.1:{self.hub_port}"
                c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
                c.ConfigurableHTTPProxy.command = [{str(_chp())!r}]
                c.JupyterHub.db_url = "sqlite:///{base}/jupyterhub.sqlite"
                c.JupyterHub.cookie_secret_file = "{base}/cookie_secret"
                c.JupyterHub.pid_file = "{base}/jupyterhub.pid"
                """
            )
        )
        self.api_url = f"http://127.0.0.1:{self.hub_port}/hub/api"

    def start(self) -> Hub:
        self.log = open(self.base / "jupyterhub.log", "a+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.base / "jupyterhub_config.py")],
            cwd=self.base, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyterhub exited {self.proc.returncode}:\n{self.output()}")
            try:
                return bool(self.api("GET", "users"))
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(up, 90, "the Hub to answer")
        return self

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-6000:]

    def _request(self, url: str, method: str, body: dict | None, token: str = ADMIN_TOKEN):
        req = urllib.request.Request(
            url, method=method, headers={"Authorization": f"token {token}"},
            data=json.dumps(body).encode() if body is not None else None,
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")

    def api(self, method: str, path: str, body: dict | None = None, token: str = ADMIN_TOKEN):
        return self._request(f"{self.api_url}/{path}", method, body, token)

    def server(self, user: str, method: str, path: str, body: dict | None = None, token: str = ADMIN_TOKEN):
        """Call a user's server through the Hub's proxy, as the browser would."""
        return self._request(f"http://127.0.0.1:{self.port}/user/{user}/{path}", method, body, token)

    def refused_at(self, user: str, method: str, path: str, token: str) -> tuple[int, str]:
        """The error a call to ``user``'s server answers (its code, its body's text)."""
        with pytest.raises(urllib.error.HTTPError) as e:
            self.server(user, method, path, {}, token)
        return e.value.code, e.value.read().decode(errors="replace")

    def spawn(self, user: str) -> int:
        """Start ``user``'s server; its pid once the Hub says it is ready."""
        try:
            self.api("POST", f"users/{user}/server")
        except urllib.error.HTTPError as e:
            if e.code != 400:  # 400: already running
                raise
        wait_until(lambda: self.api("GET", f"users/{user}")["servers"].get("", {}).get("ready"), 90, f"{user}'s server")
        return self.api("GET", f"users/{user}")["servers"][""]["state"]["pid"]  # the spawner's state (admin scope)

    def start_kernel(self, user: str) -> str:
        return self.server(user, "POST", "api/kernels", {"name": "python3"})["id"]

    def refused(self, user: str) -> tuple[int, str]:
        with pytest.raises(urllib.error.HTTPError) as e:
            self.start_kernel(user)
        return e.value.code, json.loads(e.value.read())["message"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # cleanup_servers: the Hub stops the users' servers too
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def hub_host():
    with shared_scratch("gpushare-hub-") as base:
        shared = ensure_user(SHARED)
        ensure_user(UNIX_HUB_USER)
        broker_port = free_port()
        broker = hub = None
        try:
            tls = make_certificates(base)
            hub = Hub(base, f"tls://127.0.0.1:{broker_port}", tls["ca"], SHARED)
            for user in (ALICE, BOB, CAROL):
                home = hub.homes / user
                home.mkdir()
                os.chown(home, shared.pw_uid, shared.pw_gid)
            broker = Broker(
                base,
                extra=f"""
                c.GpuShareBroker.tcp_address = "127.0.0.1:{broker_port}"
                c.GpuShareBroker.tcp_certfile = {str(tls["cert"])!r}
                c.GpuShareBroker.tcp_keyfile = {str(tls["key"])!r}
                c.GpuShareBroker.hub_api_url = {hub.api_url!r}
                c.GpuShareBroker.hub_api_token = {BROKER_TOKEN!r}
                c.GpuShareBroker.session_ttl = {TTL}
                c.GpuShareBroker.group_limits = {{{HUB_GROUP!r}: {{"max_total": None}}}}
                """,
            ).start()
            hub.start()
            pids = {user: hub.spawn(user) for user in (ALICE, BOB, CAROL)}
            yield broker, hub, pids, (f"tls://127.0.0.1:{broker_port}", str(tls["ca"]))
        finally:
            if hub is not None and hasattr(hub, "proc"):
                hub.stop()
            if broker is not None:
                broker.stop()
            for name in (SHARED, UNIX_HUB_USER):
                remove_user(name)


def kernels_by_user(broker: Broker) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for k in broker.admin_view()["kernels"]:
        out.setdefault(k["user"], []).append(k["kernel_id"])
    return out


def alices(broker: Broker, hub) -> list[str]:
    """Alice's two kernels: the first test starts them, and a test run without it starts them here."""
    for _ in range(2 - len(kernels_by_user(broker).get(ALICE, []))):
        hub.start_kernel(ALICE)
    return kernels_by_user(broker)[ALICE]


@needs_hub
def test_servers_of_one_unix_user_are_told_apart_by_hub_token(hub_host):
    broker, hub, pids, _ = hub_host
    assert {psutil.Process(pid).uids().real for pid in pids.values()} == {ensure_user(SHARED).pw_uid}
    a1, a2 = hub.start_kernel(ALICE), hub.start_kernel(ALICE)
    code, message = hub.refused(ALICE)  # default limit 4 GiB: a third 2 GiB kernel is over it
    assert code == 400 and "'alice' may hold at most 4 GiB" in message
    b1, b2 = hub.start_kernel(BOB), hub.start_kernel(BOB)  # bob's Hub group lifts the total limit
    code, message = hub.refused(CAROL)  # the card (10 GiB, 4 x 2.5 GiB) is full, host-wide
    assert code == 503 and "No GPU has room" in message
    assert kernels_by_user(broker) == {ALICE: [a1, a2], BOB: [b1, b2]}
    view = broker.admin_view()
    assert all(k["server_pid"] is None and k["kernel_pid"] is None for k in view["kernels"])  # no pids: sessions
    assert view["cards"][0]["reserved_mib"] == 4 * 2560
    assert (
        "authenticated by JupyterHub token as hub:alice:" in broker.output() and ", TLS 127.0.0.1:" in broker.output()
    )
    hub.server(BOB, "DELETE", f"api/kernels/{b2}")
    wait_until(lambda: b2 not in kernels_by_user(broker).get(BOB, []), what="bob's release")


@needs_hub
def test_student_cannot_release_read_or_forge_and_hub_admin_sees_all(hub_host):
    broker, hub, _, (address, ca) = hub_host
    alice_ids = alices(broker, hub)
    bob_token = hub.api("POST", f"users/{BOB}/tokens", {"note": "gpushare test"})["token"]
    bob = BrokerLedger(address, token=bob_token, ca_file=ca)
    try:
        assert bob.hello()["user"] == BOB and bob.hello()["session"].startswith(f"hub:{BOB}:")
        with pytest.raises(LedgerError, match="another user's; you may not release it"):
            bob.release(alice_ids[0])
        assert bob.get(alice_ids[0]) is None
        with pytest.raises(LedgerError, match="in use by another user's kernel"):
            bob.reserve(Request(alice_ids[1], parse_size("1GiB")), None, [], False)
        forged = bob.reserve(Request("forged-1", parse_size("1GiB"), user=ALICE), None, [], False)
        assert forged.user == BOB  # the name in the request is ignored
        bob.release("forged-1")
        text = json.dumps(bob.view()) + json.dumps([x.__dict__ for x in bob.leases()], default=str)
        assert ALICE not in text and not any(kid in text for kid in alice_ids)
    finally:
        bob.close()
    assert kernels_by_user(broker)[ALICE] == alice_ids  # untouched
    with pytest.raises(LedgerError, match="does not accept this token"):
        BrokerLedger(address, token="not-a-token", ca_file=ca).view()
    host, port = address.removeprefix("tls://").split(":")
    raw = socket.create_connection((host, int(port)))
    with ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname=host) as s:
        s.sendall(b'{"op": "view"}\n')  # no token: nothing but the request to send one
        reply = json.loads(s.makefile().readline())
    assert not reply["ok"] and "Send your JupyterHub API token first" in reply["message"]
    # through the servers' own REST API (via the Hub's proxy): the student sees totals, the Hub admin all
    student = hub.server(BOB, "GET", "api/gpushare/host")
    assert student["admin"] is False and student["cards"][0]["others_reserved_mib"] == 2 * 2560
    assert ALICE not in json.dumps(student) and not any(kid in json.dumps(student) for kid in alice_ids)
    admin = hub.server(CAROL, "GET", "api/gpushare/host")
    assert admin["admin"] is True and {u["user"] for u in admin["users"]} == {ALICE, BOB}


@needs_hub
def test_a_parked_kernel_comes_back_only_for_its_own_user(hub_host):
    """Bob asks to bring Alice's parked kernel back (its id is readable in /proc by anyone on the host): through her
    server the Hub refuses his token (403); through his own server the kernel is not his (404, with why); at the
    broker he can neither reserve her parked kernel's id nor give back her parked state. Her kernel stays parked
    and comes back when she asks."""
    broker, hub, _, (address, ca) = hub_host
    kid = alices(broker, hub)[0]
    path = f"api/gpushare/kernels/{kid}"
    hub.server(ALICE, "POST", f"{path}/park", {})
    assert hub.server(ALICE, "GET", path)["state"] == "parked"
    bob_token = hub.api("POST", f"users/{BOB}/tokens", {"note": "gpushare resume test"})["token"]
    code, _ = hub.refused_at(ALICE, "POST", f"{path}/resume", bob_token)
    assert code == 403
    code, said = hub.refused_at(BOB, "POST", f"{path}/resume", bob_token)
    assert code == 404 and f"No kernel {kid} holds or waits for a GPU quota on this server" in said, said
    bob = BrokerLedger(address, token=bob_token, ca_file=ca)
    try:
        with pytest.raises(LedgerError, match="in use by another user's kernel"):
            bob.reserve(Request(kid, parse_size("2GiB")), None, [], False)
        with pytest.raises(LedgerError, match="another user's"):
            bob.unpark(kid)
    finally:
        bob.close()
    assert hub.server(ALICE, "GET", path)["state"] == "parked"
    assert hub.server(ALICE, "POST", f"{path}/resume", {})["state"] == "running"


@needs_hub
def test_a_hub_user_named_root_is_no_admin_over_tcp(hub_host):
    """'root' (or the broker's own Unix user's name) is only a name on TCP: admin rights there come from the Hub's
    admin flag or the broker's admin_users and admin_groups, never from the Unix-root rule."""
    broker, hub, _, (address, ca) = hub_host
    alice_ids = alices(broker, hub)
    token = hub.api("POST", "users/root/tokens", {"note": "gpushare test"})["token"]
    root = BrokerLedger(address, token=token, ca_file=ca)
    try:
        assert root.hello()["user"] == "root" and root.hello()["admin"] is False
        with pytest.raises(LedgerError, match="another user's; you may not release it"):
            root.release(alice_ids[0])
        assert ALICE not in json.dumps(root.view()) and root.get(alice_ids[0]) is None
    finally:
        root.close()
    assert kernels_by_user(broker)[ALICE] == alice_ids


@needs_hub
def test_hub_groups_count_for_unix_socket_callers_too(hub_host):
    broker, _, _, _ = hub_host
    code = f"""
        import json
        from jupyter_gpushare.broker import BrokerLedger
        print(json.dumps(BrokerLedger({broker.socket!r}).hello()))
    """
    in_group = as_user(ensure_user(UNIX_HUB_USER), Path("/tmp"), code)
    outside = as_user(ensure_user(SHARED), Path("/tmp"), code)
    assert in_group["user"] == UNIX_HUB_USER and in_group["limits"]["max_total"] is None  # from the Hub group
    assert outside["limits"]["max_total"] == "4 GiB"  # the default


@needs_hub
def test_broker_restart_keeps_live_sessions_and_a_killed_server_expires(hub_host):
    broker, hub, pids, _ = hub_host
    before = kernels_by_user(broker)
    broker.stop()
    time.sleep(TTL + 1)  # longer than a session lives: the restart must not count the outage against them
    broker.start()
    assert kernels_by_user(broker) == before
    time.sleep(TTL + 1)  # the servers reconnected with their tokens and keep their sessions alive
    assert kernels_by_user(broker) == before
    b3 = hub.start_kernel(BOB)
    assert b3 in kernels_by_user(broker)[BOB]
    # alice's "container" dies: the server and its kernels, killed at once; the broker sees no process
    server = psutil.Process(pids[ALICE])
    for proc in [*server.children(recursive=True), server]:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:  # a child that ended on its own after it was listed
            pass
    killed = time.monotonic()
    wait_until(lambda: ALICE not in kernels_by_user(broker), timeout=30, what="alice's reservations to expire")
    assert time.monotonic() - killed >= TTL - 1.5  # by the session's expiry (its last call was <= 0.5 s before)
    assert "Reclaimed" in broker.output() and BOB in kernels_by_user(broker)
