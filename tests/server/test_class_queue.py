"""A class at several times the card: 60 notebooks for 10 places, through one browser's 6 connections.

A real jupyter-server on a simulated 10 GiB card (1 GiB reservations: 10 places). Each student opens a notebook
(POST /api/sessions through an HTTP client that, like a browser, has 6 connections to the server), connects to
its kernel's websocket, runs a cell that holds the GPU for a moment, and closes the notebook. Some reload while
they wait: the page goes (websocket closed), comes back (the same POST), and runs the cell again. Every job must
run exactly once, on the one kernel of its notebook, and nothing may be left when the class is done.

One user's 50 waiting kernels do not delay another user's kernel that fits: through the broker's own request
handling (two callers, one ledger).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import pytest
from jupyter_client.session import Session
from kernels import TIMEOUT, cell_result, send_cell
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

STUDENTS = 60
RELOADING = range(0, STUDENTS, 6)  # every sixth student reloads while waiting
JOB = "import time; time.sleep(1.0); 6 * 7"


@pytest.fixture
def gpushare_config(gpushare_config):
    return {
        **gpushare_config,
        "default_quota": "512MiB",  # + 512 MiB context reserve: 10 places on the 10 GiB card
        "queue_max_per_user": 0,  # one user is the whole class here
        "queue_timeout": 600,
    }


@pytest.mark.alone
async def test_sixty_notebooks_for_ten_places_through_six_connections(
    gpushare, jp_serverapp, jp_http_port, jp_base_url, jp_auth_header, kernel_ws
):
    http = AsyncHTTPClient(force_instance=True, max_clients=6)
    base = f"http://localhost:{jp_http_port}{jp_base_url}"

    async def call(method: str, path: str, body: dict | None = None) -> dict | None:
        r = await http.fetch(
            HTTPRequest(
                base + path, method=method, headers=jp_auth_header, request_timeout=TIMEOUT, connect_timeout=TIMEOUT,
                body=json.dumps(body) if body is not None else None, allow_nonstandard_methods=True,
            )
        )  # fmt: skip
        return json.loads(r.body) if r.body else None

    async def state_of(kernel_id: str) -> str | None:
        # through the class's own 6 connections, with its timeout: under 60 kernels on 2 cores this answer took
        # over jp_fetch's 20 s at times (1 of 3 runs here on the code of stop 52 too; not fixed)
        kernels = (await call("GET", "api/gpushare/kernels") or {})["kernels"]
        return next((k["state"] for k in kernels if k["kernel_id"] == kernel_id), None)

    async def open_notebook(path: str) -> tuple[str, str]:
        body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
        session = await call("POST", "api/sessions", body)
        return session["id"], session["kernel"]["id"]

    kernels_of: dict[str, set[str]] = {}
    results: dict[str, str] = {}

    async def student(i: int) -> None:
        path = f"student-{i}.ipynb"
        await asyncio.sleep(random.uniform(0, 2))  # the class arrives within two seconds
        session_id, kernel_id = await open_notebook(path)
        kernels_of.setdefault(path, set()).add(kernel_id)
        session = Session()
        ws = await kernel_ws(kernel_id, session.session)
        msg_id = send_cell(ws, session, JOB)
        if i in RELOADING and await state_of(kernel_id) == "queued":
            ws.close()  # the page reloads: its websocket goes, and what it sent with it
            await asyncio.sleep(0.5)
            session_id, kernel_id = await open_notebook(path)
            kernels_of[path].add(kernel_id)
            session = Session()
            ws = await kernel_ws(kernel_id, session.session)
            msg_id = send_cell(ws, session, JOB)  # the student runs the cell again
        results[path] = await cell_result(ws, kernel_id, msg_id, timeout=2 * TIMEOUT)
        ws.close()
        await call("DELETE", f"api/sessions/{session_id}")

    await asyncio.wait_for(asyncio.gather(*(student(i) for i in range(STUDENTS))), 3 * TIMEOUT)

    assert len(results) == STUDENTS and set(results.values()) == {"42"}  # 0 failed
    assert {p: len(ids) for p, ids in kernels_of.items() if len(ids) != 1} == {}  # 0 duplicates: a reload reuses
    events = (await gpushare.get("events"))["events"]
    assert "queued" in [e["kind"] for e in events]  # (the class did wait)
    assert not [e for e in events if e["kind"] == "refused"]
    # 0 orphans: no kernel, no reservation, no place in line left once the class has gone.
    assert jp_serverapp.kernel_manager.list_kernel_ids() == []
    assert (await gpushare.get("kernels"))["kernels"] == []
    assert (await gpushare.get("queue"))["queue"] == []
    assert (await gpushare.get("cards"))["cards"][0]["reserved_mib"] == 0


def test_fifty_waiting_kernels_of_one_user_do_not_delay_another_users_kernel_that_fits(inproc):
    """Through the broker's own request handling: alice queues 50 kernels that cannot fit now (8 GiB, with 6 GiB
    of the 10 GiB card reserved); bob's 2 GiB kernel fits in what is free, and is placed at once."""
    from jupyter_gpushare.broker.protocol import decode_request

    broker, callers = inproc
    broker.policy = dataclasses.replace(broker.policy, max_waiting=0)  # 50 in line: past the default cap
    alice, bob = callers["alice"], callers["bob"]

    def reserve(caller, kernel_id: str, gib: int) -> dict:
        op, args = decode_request({"op": "reserve", "args": {"kernel_id": kernel_id, "mib": gib * 1024, "wait": True}})
        return broker.handle(caller, op, args)

    assert "lease" in reserve(alice, "a-running", 5)  # 5.5 GiB reserved: 4.5 GiB free
    for n in range(50):
        assert "waiting" in reserve(alice, f"a-wait-{n}", 8)
    got = reserve(bob, "b-small", 2)
    assert "lease" in got and got["lease"]["user"] == "bob"
    waiters = broker._ledger.waiters()
    assert len(waiters) == 50 and {w.user for w in waiters} == {"alice"}
