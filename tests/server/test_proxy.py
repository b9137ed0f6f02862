"""Behind a reverse proxy: nginx (Debian's package) with its default 60 s ``proxy_read_timeout`` in front of a
real jupyter-server. A kernel that waits 3 minutes for a GPU starts, and runs the cell run while it waited.

With a waiting start held as an HTTP request (the old design), the proxy cut it after 60 s. Now the start answers
at once, and the kernel's websocket is open: the server's websocket pings (every 30 s) keep the proxy's read
timeout from firing while the kernel waits.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from jupyter_client.session import Session
from kernels import cell_result, send_cell
from servers import TOKEN, SimulatedServer, free_port, wait_until
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
WAIT_S = 180  # three times the proxy's read timeout

CONFIG = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $http_host;
            # proxy_read_timeout: not set, so nginx's default (60 s) applies
        }}
    }}
}}
"""


@pytest.fixture
def proxied(tmp_path):
    if NGINX is None:
        pytest.skip("needs nginx (apt-get install nginx)")
    server = SimulatedServer(tmp_path, "--GpuShareApp.default_quota=4GiB", "--GpuShareApp.queue_timeout=600")
    nginx = None
    try:
        server.wait_ready()
        port = free_port()
        conf = tmp_path / "nginx.conf"
        conf.write_text(CONFIG.format(tmp=tmp_path, port=port, upstream=server.port))
        nginx = subprocess.Popen([NGINX, "-c", str(conf), "-e", str(tmp_path / "error.log")])
        wait_until(lambda: _answers(port), 30, "nginx to answer")
        yield port, server
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(10)
        server.stop()


def _answers(port: int) -> bool:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={TOKEN}", timeout=2)
        return True
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.slow
async def test_a_kernel_that_waits_three_minutes_behind_nginx_runs_the_cell_run_meanwhile(proxied):
    port, _ = proxied
    http = AsyncHTTPClient(force_instance=True)
    headers = {"Authorization": f"token {TOKEN}"}

    async def call(method: str, path: str, body: dict | None = None) -> dict | None:
        r = await http.fetch(
            HTTPRequest(f"http://127.0.0.1:{port}/{path}", method=method, headers=headers,
                        body=json.dumps(body) if body is not None else None, request_timeout=30)
        )  # fmt: skip
        return json.loads(r.body) if r.body else None

    async def open_notebook(name: str) -> dict:
        return await call("POST", "api/sessions", {"path": name, "type": "notebook", "name": name, "kernel": {"name": "python3"}})  # fmt: skip

    first = await open_notebook("a.ipynb")
    await open_notebook("b.ipynb")
    waiting = await open_notebook("c.ipynb")
    kernel_id = waiting["kernel"]["id"]
    assert (await call("GET", f"api/gpushare/kernels/{kernel_id}"))["state"] == "queued"

    session = Session()
    ws = await websocket_connect(
        HTTPRequest(f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id={session.session}",
                    headers=headers, request_timeout=30)
    )  # fmt: skip
    # the cell's GPU import waits for the grant (CPU cells would run at once: the kernel runs while it waits)
    msg_id = send_cell(ws, session, "import torch, os; int(os.environ['GPUSHARE_QUOTA_MIB'])")
    t0 = time.monotonic()
    while time.monotonic() - t0 < WAIT_S:  # nothing comes while it waits; a cut connection would read None
        try:
            message = await asyncio.wait_for(ws.read_message(), WAIT_S - (time.monotonic() - t0))
        except asyncio.TimeoutError:
            break
        assert message is not None, f"the proxy cut the websocket after {time.monotonic() - t0:.0f} s"
    assert (await call("GET", f"api/gpushare/kernels/{kernel_id}"))["state"] == "queued"

    await call("DELETE", f"api/sessions/{first['id']}")
    assert await cell_result(ws, kernel_id, msg_id, timeout=60) == "4096"
    ws.close()
