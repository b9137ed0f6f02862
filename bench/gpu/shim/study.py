"""The allocation shim, measured (gpushare_shim.c): does an LD_PRELOAD interposer of the CUDA driver's allocation
calls hold a process to a limit, whatever framework allocates, what does it cost, and how is it escaped? Run as
root on a GPU machine (it builds the shim with gcc against /usr/local/cuda/include):

    python3 bench/gpu/shim/study.py OUT.json

Each case is a fresh process that takes 3 GiB, then 2 GiB more, under a 4 GiB limit (the second must be refused),
without the shim (a control: both are granted) and with it. Then the escapes: an `env -i` child (LD_PRELOAD is
dropped), the same child with the shim in /etc/ld.so.preload and its limit found from the process's kernel cgroup
(removed again at once), and libcuda called through ctypes. Then the cost, side by side in one run: raw
cudaMalloc/cudaFree pairs, and a small PyTorch training loop, each alternately without and with the shim.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIMIT_MIB = 4096
ALLOC = {
    "cupy-raw": "import cupy\nr = cupy.cuda.runtime\ndef take(g): return r.malloc(int(g * 2**30))\n",
    "cupy-pool": "import cupy\nkeep = []\ndef take(g): keep.append(cupy.empty(int(g * 2**30), dtype=cupy.uint8))\n",
    "cupy-async-pool": (
        "import cupy\ncupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)\nkeep = []\n"
        "def take(g): keep.append(cupy.empty(int(g * 2**30), dtype=cupy.uint8)); cupy.cuda.Device().synchronize()\n"
    ),
    "torch": "import torch\nkeep = []\ndef take(g): keep.append(torch.empty(int(g * 2**30), dtype=torch.uint8, device='cuda'))\n",
    "torch-expandable": (
        "import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\nimport torch\nkeep = []\n"
        "def take(g): keep.append(torch.empty(int(g * 2**30), dtype=torch.uint8, device='cuda'))\n"
    ),
    "jax": (
        "import os\nos.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'\nimport jax, jax.numpy as jnp\nkeep = []\n"
        "def take(g): keep.append(jnp.ones(int(g * 2**30), dtype=jnp.uint8).block_until_ready())\n"
    ),
    "ctypes-libcuda": (
        "import ctypes\ncu = ctypes.CDLL('libcuda.so.1')\nassert cu.cuInit(0) == 0\n"
        "dev, ctx = ctypes.c_int(), ctypes.c_void_p()\ncu.cuDeviceGet(ctypes.byref(dev), 0)\n"
        "cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)\n"
        "def take(g):\n    p = ctypes.c_uint64()\n    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(g * 2**30)))\n"
        "    if rc: raise MemoryError(f'cuMemAlloc_v2 returned {rc}')\n"
    ),
}
TRY = "import json\ngot = []\nfor g in (3, 2):\n    try:\n        take(g); got.append([g, 'ok'])\n    except Exception as e:\n        got.append([g, f'{type(e).__name__}: {str(e)[:100]}'])\nprint('RESULT', json.dumps(got), flush=True)\n"
COST_MALLOC = (
    "import time, cupy\nr = cupy.cuda.runtime\nr.free(r.malloc(1))\nt = time.perf_counter()\n"
    "for _ in range(20000):\n    r.free(r.malloc(2**20))\nprint('RESULT', time.perf_counter() - t, flush=True)\n"
)
COST_TRAIN = (
    "import time, torch\nm = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()\n"
    "opt = torch.optim.SGD(m.parameters(), lr=0.01)\nx = torch.randn(512, 2048, device='cuda'); y = torch.randint(0, 10, (512,), device='cuda')\n"
    "def step():\n    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()\n"
    "for _ in range(20): step()\ntorch.cuda.synchronize(); t = time.perf_counter()\n"
    "for _ in range(500): step()\ntorch.cuda.synchronize(); print('RESULT', time.perf_counter() - t, flush=True)\n"
)


def run(code: str, env: dict, timeout: float = 120) -> tuple[str, str]:
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT")), None)
    return (line[len("RESULT ") :] if line else "none"), (p.stderr[-400:] if not line else "")


def main(out: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="shim-"))
    lib = work / "libgpushare_shim.so"
    build = subprocess.run(
        ["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-I/usr/local/cuda/include", str(HERE / "gpushare_shim.c"), "-o",
         str(lib), "-ldl", "-lpthread"], capture_output=True, text=True,
    )  # fmt: skip
    result: dict = {
        "what": "bench/gpu/shim/study.py",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip(),  # fmt: skip
        "build": [build.returncode, build.stderr[-500:]],
        "limit_mib": LIMIT_MIB,
    }
    base = dict(os.environ)
    shim = {**base, "LD_PRELOAD": str(lib), "GPUSHARE_SHIM_LIMIT_MIB": str(LIMIT_MIB)}
    cases = {}
    for name, prelude in ALLOC.items():
        cases[name] = {"without": run(prelude + TRY, base), "with": run(prelude + TRY, shim)}
        print(name, json.dumps(cases[name])[:300], flush=True)
    result["frameworks"] = cases

    escapes = {}
    child = ALLOC["cupy-raw"] + TRY
    escapes["env-i child"] = run(
        f"import subprocess, sys\np = subprocess.run(['env', '-i', sys.executable, '-c', {child!r}], capture_output=True, text=True)\n"
        "print(next(x for x in p.stdout.splitlines() if x.startswith('RESULT')))",
        shim,
    )
    # the shim for every process of the host, its limit from the process's kernel cgroup (as a server would set it)
    group = Path("/sys/fs/cgroup/gpushare-kernels/shim-study")
    limits = Path("/run/jupyter-gpushare/limits")
    try:
        group.mkdir(parents=True, exist_ok=True)
        limits.mkdir(parents=True, exist_ok=True)
        (limits / "shim-study").write_text(str(LIMIT_MIB))
        Path("/etc/ld.so.preload").write_text(str(lib) + "\n")
        enter = f"import os\nopen({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\nos.execv('/usr/bin/env', ['env', '-i', {sys.executable!r}, '-c', {child!r}])"
        escapes["env-i child, ld.so.preload, cgroup limit"] = run(
            enter, {"PATH": base["PATH"], "PYTHONPATH": base.get("PYTHONPATH", "")}
        )
        escapes["env-i, ld.so.preload, no kernel cgroup"] = run(
            child, {"PATH": base["PATH"], "PYTHONPATH": base.get("PYTHONPATH", "")}
        )
    finally:
        Path("/etc/ld.so.preload").unlink(missing_ok=True)
        time.sleep(0.5)
        try:
            group.rmdir()
            group.parent.rmdir()
        except OSError as e:
            escapes["cleanup"] = str(e)
    result["escapes"] = escapes
    print("escapes", json.dumps(escapes)[:600], flush=True)

    cost: dict = {
        "malloc_free_20000x1MiB_s": {"without": [], "with": []},
        "torch_500_steps_s": {"without": [], "with": []},
    }
    for _ in range(3):
        for key, code in (("malloc_free_20000x1MiB_s", COST_MALLOC), ("torch_500_steps_s", COST_TRAIN)):
            for which, env in (("without", base), ("with", shim)):
                value, err = run(code, env)
                cost[key][which].append(float(value) if value != "none" else err)
    for pair in cost.values():
        ok = [a / b for a, b in zip(pair["with"], pair["without"]) if isinstance(a, float) and isinstance(b, float)]
        pair["ratio_with_over_without"] = [round(r, 3) for r in ok]
    result["cost"] = cost
    print("cost", json.dumps(cost), flush=True)
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
