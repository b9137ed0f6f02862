"""Frameworks inside a real kernel started by the provisioner through a real jupyter-server.

One ipykernel kernel (simulated 10 GiB card, 2 GiB quota) runs the cells a student would run,
with the real CPU builds of TensorFlow, PyTorch and JAX. On this card no framework sees a GPU,
so every report must say "not capped" with the reason; the GPU machine checks the capped path
(bench/gpu/check_caps.py, results in bench/results/).
"""

from __future__ import annotations

import os
import time

from jupyter_gpushare.host.reports import report_dir


async def run_cell(client, code: str, timeout: float = 180) -> dict:
    """Execute ``code``; its stdout, stderr and error (ename, evalue) as the notebook would show them."""
    msg_id = client.execute(code)
    out = {"stdout": "", "stderr": "", "error": None}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = await client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        content = msg["content"]
        if msg["msg_type"] == "stream":
            out[content["name"]] += content["text"]
        elif msg["msg_type"] == "error":
            out["error"] = (content["ename"], content["evalue"], "\n".join(content["traceback"]))
        elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
            return out
    raise AssertionError(f"cell did not finish in {timeout} s: {code!r}")


def report_files(kernel_id: str) -> list[str]:
    return sorted(n for n in os.listdir(report_dir()) if n.startswith(kernel_id + ".") and n.endswith(".json"))


async def test_student_notebook_in_a_real_kernel(gpushare, jp_serverapp):
    """In a kernel started by the provisioner:
    - the kernel process reports at start, before any framework is imported;
    - import tensorflow / torch / jax works unchanged, and the plain-TensorFlow growth cell runs;
    - each framework's real out-of-memory error keeps its traceback and is followed by the note with the
      kernel's quota and the server's maximum; other errors get no note;
    - a child process of the kernel reports too, and the API merges it with the kernel's own report;
    - the API says which frameworks were capped, or why not;
    - shutting the kernel down removes its report files."""
    kid = await gpushare.start_kernel()
    km = jp_serverapp.kernel_manager.get_kernel(kid)
    client = km.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        assert report_files(kid) == [f"{kid}.{km.provisioner.pid}.json"]

        r = await run_cell(
            client,
            "import os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\nimport tensorflow as tf, torch, jax, jax.numpy as jnp\n"
            "gpus = tf.config.list_physical_devices('GPU')\n"
            "for gpu in gpus:\n    tf.config.experimental.set_memory_growth(gpu, True)\n"
            "print(len(gpus), torch.cuda.is_initialized())",
        )
        assert r["error"] is None, r
        assert r["stdout"].split() == ["0", "False"]

        note = "[jupyter-gpushare]"
        cells = {
            "jax": "jnp.zeros((2**44,), dtype=jnp.uint8).block_until_ready()",
            "tensorflow": "tf.zeros([2**44], dtype=tf.uint8)",
            # torch's CPU build cannot run out of GPU memory; raise its real error class as the allocator would
            "torch": "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')",
        }
        names = {"jax": "JAX", "tensorflow": "TensorFlow", "torch": "PyTorch"}
        for framework, code in cells.items():
            r = await run_cell(client, code)
            assert r["error"] is not None, framework
            ename, evalue, traceback = r["error"]
            assert ename in ("JaxRuntimeError", "XlaRuntimeError", "ResourceExhaustedError", "OutOfMemoryError")
            assert "Traceback" in traceback or "----" in traceback  # IPython's usual traceback is still shown
            assert f"{note} {names[framework]} ran out of memory." in r["stderr"], r
            # the server offers 1.5x the quota to restart with, through the queue, within the server's maximum
            assert "quota is 2 GiB" in r["stderr"]
            assert (
                "restart it with 3 GiB (GPU panel: Restart with 3 GiB; it waits if the GPU is full; at most"
                in r["stderr"]
            )
            assert "learns from it" not in r["stderr"]  # quota_from_history is off: no notebook learns
        r = await run_cell(client, "1 / 0")
        assert r["error"][0] == "ZeroDivisionError" and note not in r["stderr"]

        # A child process (as `!python train.py` or a DataLoader worker) inherits the bootstrap.
        r = await run_cell(
            client,
            "import subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import torch, sys; print(1, flush=True); sys.stdin.read()'],"
            " stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
            "print(child.stdout.readline().decode().strip(), child.pid)",
        )
        ready, child_pid = r["stdout"].split()
        assert ready == "1"
        assert f"{kid}.{child_pid}.json" in report_files(kid)

        def frameworks_now():
            async def check():
                k = await gpushare.kernel(kid)
                fw = (k or {}).get("frameworks") or {}
                return fw if fw.get("torch", {}).get("processes") == 2 and {"tensorflow", "jax"} <= set(fw) else None

            return check

        fw = await gpushare.wait_for(frameworks_now(), timeout=60, what="framework reports in the API")
        for name in ("tensorflow", "torch", "jax"):
            assert fw[name]["capped"] is False and fw[name]["limit_mib"] is None
            assert "the card is simulated" in fw[name]["detail"]
        assert "built without CUDA" in fw["tensorflow"]["detail"]  # TensorFlow is asked; it says why too

        await run_cell(client, "child.stdin.close(); child.wait()")
    finally:
        client.stop_channels()
    await gpushare.stop_kernel(kid)
    assert report_files(kid) == []
