"""A kernel's reported frameworks are the ones it imported, not the ones another framework brought along.

TensorFlow 2.21 imports JAX (tf.lite) and Keras 3 imports JAX (Orbax) whenever JAX is installed, so a
TensorFlow notebook used to be listed as "jax: capped". A framework is listed when it was imported in
the kernel's process by the notebook or by any library it uses (transformers importing torch counts);
one that only another GPU framework's own import (or Keras's, for other than its backend) brought in
is reported apart, under ``pulled_in``. Real kernels through a real server, real tensorflow-cpu,
keras, torch and jax.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from apispec import conforms
from test_bootstrap import gpu_env, last_json, reports_of, run_py
from test_kernel_frameworks import run_cell

from jupyter_gpushare.host.reports import report_dir


async def _listed(gpushare, kernel_id: str, expect: str):
    async def check():
        fw = ((await gpushare.kernel(kernel_id)) or {}).get("frameworks") or {}
        return fw if expect in fw else None

    return await gpushare.wait_for(check, timeout=60, what=f"{expect} in the kernel's frameworks")


def _report(kernel_id: str, pid: int) -> dict:
    return json.loads(Path(report_dir(), f"{kernel_id}.{pid}.json").read_text())


async def test_a_kernel_lists_the_frameworks_it_imported(gpushare, jp_serverapp):
    """A kernel that imports only tensorflow lists only tensorflow (JAX, which TensorFlow's import brought in,
    is in its report under pulled_in); once the notebook imports jax itself, jax is listed too. A kernel that
    imports torch lists torch only. Before any import, the environment's knobs (XLA_*, TF_*, CUPY_*) list
    nothing. What the API shows matches its published schema."""
    tf_kernel, torch_kernel = await gpushare.start_kernel(), await gpushare.start_kernel()
    clients = {}
    try:
        for kid in (tf_kernel, torch_kernel):
            clients[kid] = jp_serverapp.kernel_manager.get_kernel(kid).client()
            clients[kid].start_channels()
            await clients[kid].wait_for_ready(timeout=60)
            assert ((await gpushare.kernel(kid)) or {}).get("frameworks") in (None, {})
        tf_pid = jp_serverapp.kernel_manager.get_kernel(tf_kernel).provisioner.pid

        r = await run_cell(
            clients[tf_kernel], "import os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\nimport tensorflow as tf"
        )
        assert r["error"] is None, r
        r = await run_cell(clients[torch_kernel], "import torch")
        assert r["error"] is None, r

        fw = await _listed(gpushare, tf_kernel, "tensorflow")
        assert set(fw) == {"tensorflow"}
        assert _report(tf_kernel, tf_pid)["pulled_in"] == {"jax": "tensorflow"}
        fw = await _listed(gpushare, torch_kernel, "torch")
        assert set(fw) == {"torch"}
        conforms(fw["torch"], "Framework")

        r = await run_cell(clients[tf_kernel], "import jax.numpy as jnp")
        assert r["error"] is None, r
        fw = await _listed(gpushare, tf_kernel, "jax")
        assert set(fw) == {"tensorflow", "jax"}
        assert _report(tf_kernel, tf_pid)["pulled_in"] == {}
    finally:
        for client in clients.values():
            client.stop_channels()
    for kid in (tf_kernel, torch_kernel):
        await gpushare.stop_kernel(kid)


async def test_views_reach_the_api(gpushare, jp_serverapp):
    """The views a kernel reports for a framework (on a GPU: torch.cuda.mem_get_info...) are shown through the API.
    The simulated card has no GPU, so nothing is wrapped in its kernels: the kernel's report is written here."""
    kid = await gpushare.start_kernel()
    km = jp_serverapp.kernel_manager.get_kernel(kid)
    client = km.client()
    client.start_channels()
    await client.wait_for_ready(timeout=60)  # its own start report is written by then
    client.stop_channels()
    pid = km.provisioner.pid
    views = ["torch.cuda.get_device_properties", "torch.cuda.mem_get_info"]
    report = {
        "pid": pid, "kernel_id": kid, "root": True, "started": time.time(), "time": time.time(),
        "frameworks": {"torch": {"capped": True, "limit_mib": 2048, "detail": "env", "views": views}},
        "views": [*views, "pynvml.nvmlDeviceGetMemoryInfo"], "pulled_in": {"jax": "tensorflow"},
    }  # fmt: skip
    Path(report_dir(), f"{kid}.{pid}.json").write_text(json.dumps(report))
    fw = await _listed(gpushare, kid, "torch")
    assert fw["torch"]["views"] == views
    conforms(fw["torch"], "Framework")
    await gpushare.stop_kernel(kid)


@pytest.mark.parametrize(
    ("code", "backend", "listed", "pulled_in"),
    [
        ("import tensorflow", None, ["tensorflow"], {"jax": "tensorflow"}),
        ("import keras", "tensorflow", ["tensorflow"], {"jax": "tensorflow"}),
        ("import keras", "torch", ["torch"], {"jax": "keras"}),
        ("import keras", "jax", ["jax"], {}),  # Keras computes with JAX: the notebook's framework
        ("import tensorflow as tf, torch, jax", None, ["jax", "tensorflow", "torch"], {}),
        ("import torch", None, ["torch"], {}),
    ],
)
def test_what_counts_as_imported(tmp_path, code, backend, listed, pulled_in):
    """Which frameworks a process lists after an import, in real interpreters with the real packages; the watch on
    import statements (a chained builtins.__import__) is there only while some framework is pulled in."""
    env = gpu_env(tmp_path, TF_CPP_MIN_LOG_LEVEL="3", **({"KERAS_BACKEND": backend} if backend else {}))
    out = run_py(
        f"{code}\nimport builtins, json\nprint(json.dumps({{'watching': builtins.__import__.__module__ == '_gpushare_boot'}}))",
        env,
    )
    assert out.returncode == 0, out.stderr
    (report,) = reports_of(tmp_path).values()
    assert sorted(report["frameworks"]) == listed
    assert report["pulled_in"] == pulled_in
    assert last_json(out.stdout) == {"watching": bool(pulled_in)}
