"""TensorFlow on a real GPU: the design card's central claim, in kernels started through the provisioner.

Run on a GPU machine with TensorFlow's GPU build (../shared/tools/tf-gpu/: ``source /tmp/tfgpu-env.sh``)
and the Jupyter wheels (bench/gpu/device_env.sh):

    JUPYTER_DATA_DIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d) python3 bench/gpu/check_tf.py out.json

First, without the extension (plain ``python3`` processes, no bootstrap): what TensorFlow's defaults take
of the card for one 256x256 tensor, and with memory growth. Then kernels with a QUOTA_MIB quota
(+ RESERVE_MIB for the CUDA context), each checked against NVML (its process tree's use, sampled every
0.1 s while it runs, so a peak between two cells is seen):

- ``import tensorflow`` makes no CUDA context; the student's usual ``set_memory_growth`` cell runs;
- 3 GiB under the quota succeeds, +2 GiB past it fails with ResourceExhaustedError followed by the
  jupyter-gpushare note, in that kernel only, while a neighbour TF kernel keeps computing;
- a notebook's own ``set_logical_device_configuration`` asking for 20,000 MiB is clamped to the quota;
- ``TF_GPU_ALLOCATOR=cuda_malloc_async`` in the kernel's environment does not break the cap;
- a Keras CNN trains (convolutions through cuDNN), in float32 and in mixed precision, within the quota;
- ``tf.function(jit_compile=True)`` (XLA) computes within the quota;
- a ``!python train.py`` child of the kernel is capped too;
- the kernel's report lists TensorFlow, and no framework the notebook did not import.

Every PASS line is backed by a figure in the JSON. GPUSHARE_CHECK_SMOKE=1 runs the plumbing on a
simulated card with tensorflow-cpu (checks that need a GPU are then expected to fail and are listed).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE]

from _manager import SMOKE, check_header, install_quota_manager  # noqa: E402
from check_caps import execute, nvml_used_by_pid, tree_pids  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

from jupyter_gpushare.host.gpu import SimulatedBackend  # noqa: E402
from jupyter_gpushare.host.gpu.nvml import NvmlBackend  # noqa: E402

QUOTA_MIB = 4096
RESERVE_MIB = 1024
LIMIT_MIB = QUOTA_MIB + RESERVE_MIB
# Sizes in MiB of float32 (2**18 elements each) and of the computations; a smoke run (CPU) uses 1/64 of them.
_DIV = 64 if SMOKE else 1
SIZES = {
    "under": 3072 // _DIV,
    "over": 2048 // _DIV,
    "clamp": 5120 // _DIV,
    "n": 4096 // _DIV,
    "n2": 8192 // _DIV,
    "images": 20000 // _DIV,
}

IMPORT = "import os, tensorflow as tf; print(tf.__version__, len(tf.config.list_physical_devices('GPU')))"
GROWTH_CELL = (  # what TensorFlow notebooks (and the study) do first
    "gpus = tf.config.list_physical_devices('GPU')\n"
    "for g in gpus:\n"
    "    tf.config.experimental.set_memory_growth(g, True)\n"
    "print('growth set on', len(gpus))"
)
UNDER = "x = tf.ones(({under} * 2**18,), tf.float32)  # 3 GiB\nprint(float(tf.reduce_sum(x[:1000])))"
OVER = (
    "y = tf.ones(({over} * 2**18,), tf.float32)  # +2 GiB: past the 4 GiB quota\nprint(float(tf.reduce_sum(y[:1000])))"
)
STILL = "print(float(tf.reduce_sum(x[:1000] + 1.0)))"
NEIGHBOUR = (
    "a = tf.random.normal(({n}, {n}))\n"
    "for _ in range(20):\n"
    "    a = tf.linalg.matmul(a, a) / {n}.0\n"
    "print('neighbour', float(tf.reduce_sum(a[:4, :4])) == float(tf.reduce_sum(a[:4, :4])))"
)
CLAMP_FIRST = (  # the notebook's own logical device, before TensorFlow initialises the GPU
    "import tensorflow as tf\n"
    "gpus = tf.config.list_physical_devices('GPU')\n"
    "tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=20000)])\n"
    "print('logical', tf.config.get_logical_device_configuration(gpus[0]))"
)
CLAMP_ALLOC = "z = tf.ones(({clamp} * 2**18,), tf.float32)  # 5 GiB: fits 20,000 MiB, not the quota\nprint(float(z[0]))"
ASYNC_ALLOC = (
    "import os\nprint('TF_GPU_ALLOCATOR', os.environ.get('TF_GPU_ALLOCATOR'))\n"
    "import tensorflow as tf\n"
    "x = tf.ones(({under} * 2**18,), tf.float32)\n"
    "y = tf.ones(({over} * 2**18,), tf.float32)\n"
    "print(float(y[0]))"
)
KERAS = """
import time, numpy as np, tensorflow as tf, keras
{policy}
x = np.random.rand({images}, 28, 28, 1).astype("float32")
y = np.random.randint(0, 10, {images})
model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.Conv2D(64, 3, activation="relu"),
    keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
    keras.layers.Dense(10, dtype="float32"),
])
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
t0 = time.time()
h = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
model.predict(x[:{images} // 4], batch_size=32, verbose=0)
print("trained", round(time.time() - t0, 1), "s, loss", round(h.history["loss"][-1], 3), "conv on", getattr(model.layers[0].kernel, "value", model.layers[0].kernel).device)
"""
XLA = """
import tensorflow as tf
@tf.function(jit_compile=True)
def step(a, b):
    return tf.nn.relu(tf.linalg.matmul(a, b)) @ tf.transpose(b) / {n}.0
a = tf.random.normal(({n2}, {n})); b = tf.random.normal(({n}, {n}))
for _ in range(50):
    a = step(a, b)
print("xla", a.shape, float(tf.reduce_sum(a[:2, :2])) == float(tf.reduce_sum(a[:2, :2])))
"""
CHILD = (
    "import subprocess, sys\n"
    "code = 'import tensorflow as tf; x = tf.ones(({under} * 2**18,), tf.float32); y = tf.ones(({over} * 2**18,), tf.float32); print(float(y[0]))'\n"
    "r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
    "print('child rc', r.returncode); print(r.stderr[-2500:])"
)
BASELINE = (  # no extension: a plain process, as before jupyter-gpushare
    "import os, sys, time, tensorflow as tf\n"
    "x = tf.ones((256, 256)); print(float(tf.reduce_sum(x)), flush=True)\n"
    "print('READY', os.getpid(), flush=True); time.sleep(4)"
)


class PeakWatch:
    """NVML use of each watched process tree, sampled every 0.1 s in a thread: the highest seen."""

    def __init__(self, handle) -> None:
        self.handle, self.roots, self.peak = handle, {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, name: str, pid: int) -> None:
        self.roots[name] = pid
        self.peak.setdefault(name, 0)

    def now(self, name: str) -> int:
        used = nvml_used_by_pid(self.handle)
        return sum(used.get(p, 0) for p in tree_pids(self.roots[name]))

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            used = nvml_used_by_pid(self.handle)
            for name, pid in list(self.roots.items()):
                mib = sum(used.get(p, 0) for p in tree_pids(pid))
                self.peak[name] = max(self.peak[name], mib)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def baseline(handle, growth: bool) -> dict:
    """A plain TensorFlow process (no extension): its NVML use for one 256x256 tensor."""
    env = {k: v for k, v in os.environ.items() if k != "TF_FORCE_GPU_ALLOW_GROWTH"}
    if growth:
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    p = subprocess.Popen(
        [sys.executable, "-c", BASELINE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    out = {"growth": growth, "used_mib": None}
    for line in p.stdout:
        if line.startswith("READY"):
            time.sleep(1.0)
            out["used_mib"] = sum(nvml_used_by_pid(handle).get(q, 0) for q in tree_pids(p.pid))
            break
    p.wait(timeout=120)
    out["rc"], out["stderr_tail"] = p.returncode, p.stderr.read()[-600:]
    return out


async def start(name: str, watch: PeakWatch, env: dict | None = None) -> tuple:
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel(env={**os.environ, **(env or {})})
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    watch.watch(name, km.provisioner.pid)
    return km, kc


def oom(r: dict) -> bool:
    err = r["error"] or {}
    return "ResourceExhausted" in f"{err.get('ename')} {err.get('evalue')}"


async def main(path: str) -> int:
    handle, _, head = check_header(
        "bench/gpu/check_tf.py: TensorFlow in kernels started by the gpushare provisioner", QUOTA_MIB, RESERVE_MIB
    )
    total = head["card_total_mib"]
    import tensorflow as tf_here  # only its version: the checks run in kernels and child processes

    result: dict = {
        **head,
        "tensorflow": tf_here.__version__,
        "baseline": {},
        "kernels": {},
        "checks": {},
    }
    del tf_here
    checks = result["checks"]
    for growth in (False, True):
        b = result["baseline"]["growth" if growth else "default"] = baseline(handle, growth)
        print("baseline", b["growth"], b["used_mib"], "MiB", flush=True)
    d, g = result["baseline"]["default"]["used_mib"] or 0, result["baseline"]["growth"]["used_mib"] or 0
    checks["without the extension, TF's default takes most of the card for one small tensor"] = d > 0.8 * total
    checks["without the extension, memory growth takes little for it"] = 0 < g < 0.05 * total

    manager = install_quota_manager(SimulatedBackend([total]) if SMOKE else NvmlBackend(), QUOTA_MIB, RESERVE_MIB)
    watch = PeakWatch(handle)
    k = result["kernels"]
    kernels: dict[str, tuple] = {}

    async def run(name: str, code: str, timeout: float = 300) -> dict:
        r = await execute(kernels[name][1], code.format(**SIZES), timeout)
        await asyncio.sleep(0.3)
        entry = k.setdefault(name, {"steps": []})
        entry["steps"].append({"code": code.splitlines()[0][:80], "error": r["error"], "stdout": r["stdout"][-600:],
                               "stderr": r["stderr"][-1200:], "mib_now": watch.now(name), "peak_mib": watch.peak[name]})  # fmt: skip
        return r

    try:
        for name in ("a", "b"):
            kernels[name] = await start(name, watch)
            r = await run(name, IMPORT)
            checks[f"{name}: import tensorflow makes no CUDA context"] = (
                r["error"] is None and k[name]["steps"][-1]["mib_now"] == 0
            )
            r = await run(name, GROWTH_CELL)
            checks[f"{name}: the student's set_memory_growth cell runs"] = (
                r["error"] is None and "growth set on" in r["stdout"]
            )
        r = await run("a", UNDER)
        checks["a: 3 GiB under a 4 GiB quota succeeds"] = r["error"] is None
        checks["a: NVML use <= quota + reserve after 3 GiB"] = 0 < k["a"]["steps"][-1]["mib_now"] <= LIMIT_MIB
        r = await run("b", NEIGHBOUR)
        r = await run("a", OVER)
        checks["a: +2 GiB past the quota fails with ResourceExhaustedError"] = oom(r)
        checks["a: the OOM is followed by the gpushare note"] = (
            "[jupyter-gpushare]" in r["stderr"] and f"{QUOTA_MIB} MiB" in r["stderr"]
        )
        r = await run("a", STILL)
        checks["a: still computes after its OOM"] = r["error"] is None
        r = await run("b", NEIGHBOUR)
        checks["b: the neighbour keeps computing after a's OOM"] = (
            r["error"] is None and "neighbour True" in r["stdout"]
        )
        for name in ("a", "b"):
            checks[f"{name}: NVML peak <= quota + reserve"] = 0 < watch.peak[name] <= LIMIT_MIB

        kernels["clamp"] = await start("clamp", watch)
        r = await run("clamp", CLAMP_FIRST)
        checks["clamp: a notebook's 20,000 MiB logical device is clamped to the quota"] = r[
            "error"
        ] is None and f"memory_limit={QUOTA_MIB}" in r["stdout"].replace(" ", "")
        r = await run("clamp", CLAMP_ALLOC)
        checks["clamp: 5 GiB then fails with ResourceExhaustedError"] = oom(r)
        checks["clamp: NVML peak <= quota + reserve"] = watch.peak["clamp"] <= LIMIT_MIB

        kernels["async"] = await start("async", watch, {"TF_GPU_ALLOCATOR": "cuda_malloc_async"})
        r = await run("async", ASYNC_ALLOC)
        checks["async: TF_GPU_ALLOCATOR=cuda_malloc_async does not lift the cap (5 GiB fails)"] = oom(r)
        checks["async: NVML peak <= quota + reserve"] = 0 < watch.peak["async"] <= LIMIT_MIB

        for name, policy in (("keras", ""), ("mixed", "keras.mixed_precision.set_global_policy('mixed_float16')")):
            kernels[name] = await start(name, watch)
            r = await run(name, KERAS.replace("{policy}", policy), timeout=600)
            checks[f"{name}: a Keras CNN trains on the GPU (cuDNN convolutions)"] = (
                r["error"] is None and "trained" in r["stdout"] and "GPU" in r["stdout"]
            )
            checks[f"{name}: NVML peak <= quota + reserve while it trains"] = 0 < watch.peak[name] <= LIMIT_MIB

        kernels["xla"] = await start("xla", watch)
        r = await run("xla", XLA, timeout=600)
        checks["xla: tf.function(jit_compile=True) computes"] = r["error"] is None and "xla" in r["stdout"]
        checks["xla: NVML peak <= quota + reserve"] = 0 < watch.peak["xla"] <= LIMIT_MIB

        r = await run("keras", CHILD, timeout=300)
        k["keras"]["child"] = r["stdout"][-2500:]
        checks["keras: a child process (!python train.py) is capped too (5 GiB fails)"] = (
            "child rc 1" in r["stdout"] and "ResourceExhausted" in r["stdout"]
        )
        checks["keras: NVML peak of the kernel and its child <= quota + reserve"] = watch.peak["keras"] <= LIMIT_MIB * 2

        snap = await manager.snapshot()
        frameworks = {x["kernel_id"]: sorted((x.get("frameworks") or {}).keys()) for x in snap["kernels"]}
        for name, (km, _) in kernels.items():
            k[name]["frameworks"] = frameworks.get(km.kernel_id)
            k[name]["pid"] = km.provisioner.pid
        checks["every kernel's report lists tensorflow and no framework it did not import"] = all(
            k[name]["frameworks"] == ["tensorflow"] for name in kernels
        )
    finally:
        watch.close()
        for km, kc in kernels.values():
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        manager.close()
    result["peak_mib"] = dict(watch.peak)
    ok = all(checks.values())
    result["all_ok"] = ok
    for name, passed in checks.items():
        print(("PASS " if passed else "FAIL ") + name)
    print("peaks (MiB):", json.dumps(watch.peak), "limit", LIMIT_MIB)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "check_tf.json")))
