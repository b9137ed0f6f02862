"""Inside a kernel, the GPU is as large as the kernel's quota: torch, CuPy and NVML report it so.

What runs for real here: the bootstrap in real interpreters with the kernel's environment, the real
torch 2.13 CPU build and the real ``pynvml`` (nvidia-ml-py): the wrappers are installed when the
module is imported (no CUDA context), reach child processes, and the report lists them. This
machine has no GPU, so where a figure comes from the driver, only the driver call under the real
wrapped function is replaced (named in each test); CuPy needs CUDA to install, so its test uses a
stand-in package of a few lines. bench/gpu/check_views.py checks all of it on a real card.
"""

from __future__ import annotations

import json
import time

from apispec import conforms
from test_bootstrap import CARD, QUOTA, gpu_env, last_json, reports_of, run_py

from jupyter_gpushare.host.reports import clean_report, read_reports

MiB = 2**20
RESERVE = 512  # the context reserve gpu_env's lease holds


def test_torch_views_are_wrapped_at_import_and_reach_a_child(tmp_path):
    """import torch wraps mem_get_info and get_device_properties without initialising CUDA; a child
    process (as !python train.py) gets them too; both reports list them, in torch's entry as well; the CPU
    build's own error passes through unchanged. In a kernel without a GPU quota nothing is wrapped."""
    code = """
        import json, subprocess, sys
        import torch
        cuda = torch.cuda
        child = subprocess.run([sys.executable, "-c", "import torch; print(getattr(torch.cuda.mem_get_info, '_gpushare', False))"],
                               capture_output=True, text=True)
        try:
            cuda.mem_get_info()
            error = None
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        print(json.dumps({"wrapped": [getattr(cuda.mem_get_info, "_gpushare", False), getattr(cuda.get_device_properties, "_gpushare", False)],
                          "same": cuda.memory.mem_get_info is cuda.mem_get_info, "cuda_init": cuda.is_initialized(),
                          "child": child.stdout.strip(), "error": error}))
        """
    out = run_py(code, gpu_env(tmp_path))
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    assert got == {
        "wrapped": [True, True],
        "same": True,
        "cuda_init": False,
        "child": "True",
        "error": "AssertionError: Torch not compiled with CUDA enabled",  # what the CPU build says unwrapped
    }
    reports = reports_of(tmp_path)
    assert len(reports) == 2
    for r in reports.values():
        assert {"torch.cuda.mem_get_info", "torch.cuda.get_device_properties"} <= set(r["views"])
        assert r["frameworks"]["torch"]["views"] == ["torch.cuda.get_device_properties", "torch.cuda.mem_get_info"]

    no_quota = gpu_env(tmp_path, GPUSHARE_MODE="cpu", CUDA_VISIBLE_DEVICES="")
    out = run_py("import torch; print(getattr(torch.cuda.mem_get_info, '_gpushare', False))", no_quota)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


FAKE_DRIVER_TORCH = """
    import json, sys
    import torch
    cuda = torch.cuda
    GiB, MiB = 2**30, 2**20
    # No GPU here: replace only what reaches the driver or the CUDA allocator under the real wrapped functions.
    card = {"free": 70 * GiB, "total": 80 * GiB, "reserved": 512 * MiB}
    class CudaRt:
        def cudaMemGetInfo(self, device):
            return card["free"], card["total"]
    class Props:  # as torch._C._CudaDeviceProperties
        name, major, minor, multi_processor_count = "NVIDIA H100 80GB HBM3", 9, 0, 132
        total_memory = 80 * GiB
        def __repr__(self):
            return f"_CudaDeviceProperties(name='{self.name}', major=9, minor=0, total_memory={self.total_memory // MiB}MB, multi_processor_count=132)"
    cuda.cudart = lambda: CudaRt()
    cuda.current_device = lambda: 0
    cuda.memory_reserved = lambda device=None: card["reserved"]
    cuda._lazy_init = lambda: None
    cuda.device_count = lambda: 1
    cuda._get_device_properties = lambda device: Props()
    out = {"info": cuda.mem_get_info(), "info0": cuda.memory.mem_get_info(0)}
    card["reserved"] = 1500 * MiB
    out["after_1500"] = cuda.mem_get_info()
    card["free"], card["reserved"] = 1 * GiB, 0
    out["card_nearly_full"] = cuda.mem_get_info()
    card["free"], card["reserved"] = 70 * GiB, 5 * GiB
    out["past_quota"] = cuda.mem_get_info()
    p = cuda.get_device_properties(0)
    out["props"] = [p.total_memory, p.name, p.major, p.multi_processor_count, isinstance(p, Props), repr(p)]
    inside = {"__name__": "torch._inductor.gpushare_test", "cuda": cuda}
    exec("props = cuda.get_device_properties(0)", inside)  # a caller in torch's own package
    out["torch_caller"] = [type(inside["props"]).__name__, inside["props"].total_memory]
    print(json.dumps(out))
"""


def test_torch_mem_get_info_and_properties_report_the_quota(tmp_path):
    """Through the real wrapped torch functions: total is the quota, free the quota less what this process's
    caching allocator holds (memory_reserved), never more than the card has free, never below 0;
    get_device_properties forwards every attribute but total_memory and still passes isinstance; torch's own
    modules get the real object. The driver (cudart().cudaMemGetInfo), the allocator's figure and the device
    properties are replaced: this machine has no GPU."""
    out = run_py(FAKE_DRIVER_TORCH, gpu_env(tmp_path))
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    quota = QUOTA * MiB
    assert got["info"] == [quota - 512 * MiB, quota] and got["info0"] == got["info"]
    assert got["after_1500"] == [quota - 1500 * MiB, quota]
    assert got["card_nearly_full"] == [2**30, quota]  # the card's real free memory is the limit
    assert got["past_quota"] == [0, quota]
    total, name, major, sms, is_props, text = got["props"]
    assert (total, name, major, sms, is_props) == (quota, "NVIDIA H100 80GB HBM3", 9, 132, True)
    assert f"total_memory={QUOTA}MB" in text and "NVIDIA H100" in text
    assert got["torch_caller"] == ["Props", 80 * 2**30]


STAND_IN_OLD_TORCH = """
__version__ = "2.4.1+cu121"
class _Version:
    cuda = "12.1"
version = _Version()
class OutOfMemoryError(RuntimeError):
    pass
class _Props:
    total_memory = 80 * 2**30
class _Cuda:
    OutOfMemoryError = OutOfMemoryError
    queued, fractions = [], []
    def is_initialized(self):
        return False
    def _lazy_call(self, fn):
        self.queued.append(fn)
    def get_device_properties(self, device=None):
        return _Props()
    def set_per_process_memory_fraction(self, fraction, device=None):
        self.fractions.append(fraction)
    def memory_reserved(self, device=None):
        return 0
    def mem_get_info(self, device=None):
        return 70 * 2**30, 80 * 2**30
cuda = _Cuda()
"""


def test_the_deferred_torch_cap_is_taken_from_the_real_card_size(tmp_path):
    """torch < 2.11 gets its cap at CUDA initialisation from get_device_properties: that call must see the card,
    not the quota the view shows the notebook (or the cap would be the whole card). Stand-in torch: the CUDA
    build cannot run here."""
    pkg = tmp_path / "standin" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_IN_OLD_TORCH)
    (pkg / "version.py").write_text("__version__ = '2.4.1+cu121'\ncuda = '12.1'\n")
    env = gpu_env(tmp_path)
    env["PYTHONPATH"] += ":" + str(tmp_path / "standin")
    code = """
        import json, torch
        for fn in torch.cuda.queued:
            fn()  # what CUDA initialisation runs
        print(json.dumps({"fractions": torch.cuda.fractions, "seen": torch.cuda.get_device_properties(0).total_memory,
                          "info": torch.cuda.mem_get_info()}))
        """
    out = run_py(code, env)
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    assert got["fractions"] == [QUOTA / (80 * 1024)]
    assert got["seen"] == QUOTA * MiB and got["info"] == [QUOTA * MiB, QUOTA * MiB]


STAND_IN_CUPY = """
class _Runtime:
    def memGetInfo(self):
        return 70 * 2**30, 80 * 2**30
class Device:
    def __init__(self, device=0):
        self.id = device
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    @property
    def mem_info(self):
        return runtime.memGetInfo.__wrapped__() if hasattr(runtime.memGetInfo, "__wrapped__") else runtime.memGetInfo()
class _Cuda:
    pass
cuda = _Cuda()
runtime = cuda.runtime = _Runtime()
cuda.Device = Device
class _Pool:
    held = 1024 * 2**20
    def total_bytes(self):
        return self.held
_pool = _Pool()
def get_default_memory_pool():
    return _pool
"""


def test_cupy_views_report_the_quota(tmp_path):
    """cupy.cuda.runtime.memGetInfo() and cupy.cuda.Device().mem_info give the quota as total and the quota less
    what CuPy's default pool holds as free. Stand-in cupy (the driver's figures are its own): CuPy needs CUDA to
    install."""
    pkg = tmp_path / "standin" / "cupy"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_IN_CUPY)
    env = gpu_env(tmp_path)
    env["PYTHONPATH"] += ":" + str(tmp_path / "standin")
    code = """
        import json, cupy
        print(json.dumps({"runtime": cupy.cuda.runtime.memGetInfo(), "device": cupy.cuda.Device().mem_info}))
        """
    out = run_py(code, env)
    assert out.returncode == 0, out.stderr
    expected = [(QUOTA - 1024) * MiB, QUOTA * MiB]
    assert last_json(out.stdout) == {"runtime": expected, "device": expected}
    (report,) = reports_of(tmp_path).values()
    assert report["frameworks"]["cupy"]["views"] == ["cupy.cuda.Device.mem_info", "cupy.cuda.runtime.memGetInfo"]


def test_a_property_of_an_extension_type_can_be_replaced(tmp_path):
    """CuPy's Device is a Cython class, which Python refuses to change (TypeError): the view goes through the
    type's namespace. Shown on a type that refuses it the same way (datetime.timedelta, a static C type)."""
    code = """
        import datetime, json
        import _gpushare_views as views
        try:
            datetime.timedelta.days = property(lambda self: 0)
            refused = False
        except TypeError:
            refused = True
        real = datetime.timedelta.__dict__["days"]
        ok = views.set_type_attribute(datetime.timedelta, "days", property(lambda self: real.__get__(self) * 10))
        print(json.dumps({"refused": refused, "ok": ok, "days": datetime.timedelta(days=3).days}))
        """
    out = run_py(code, gpu_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert last_json(out.stdout) == {"refused": True, "ok": True, "days": 30}


FAKE_DRIVER_NVML = """
    import ctypes, json, os, subprocess, sys
    import pynvml
    MiB = 2**20
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    # No GPU here: the NVML library's C functions are replaced under the real pynvml module and its wrapper.
    cards = {1: {"uuid": b"GPU-test-0", "total": 81920 * MiB, "free": 70000 * MiB},
             2: {"uuid": b"GPU-other-1", "total": 81920 * MiB, "free": 81000 * MiB}}
    procs = {1: [(os.getpid(), 1500 * MiB), (child.pid, 300 * MiB), (os.getppid(), 6000 * MiB)], 2: [(os.getpid(), 900 * MiB)]}
    unsupported = set()
    def card(handle):
        return cards[ctypes.cast(handle, ctypes.c_void_p).value]
    def memory(handle, ref):
        c = card(handle)
        ref._obj.total, ref._obj.free, ref._obj.used = c["total"], c["free"], c["total"] - c["free"]
        if hasattr(ref._obj, "reserved"):
            ref._obj.reserved = 400 * MiB
        return 0
    def uuid(handle, buf, size):
        buf.value = card(handle)["uuid"]
        return 0
    def processes(handle, count, array):
        if "processes" in unsupported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        mine = procs[ctypes.cast(handle, ctypes.c_void_p).value]
        if array is None:
            count._obj.value = len(mine)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE if mine else 0
        for i, (pid, used) in enumerate(mine):
            array[i].pid, array[i].usedGpuMemory = pid, used
        count._obj.value = len(mine)
        return 0
    functions = {"nvmlDeviceGetMemoryInfo": memory, "nvmlDeviceGetMemoryInfo_v2": memory, "nvmlDeviceGetUUID": uuid,
                 "nvmlDeviceGetComputeRunningProcesses_v3": processes,
                 "nvmlDeviceGetGraphicsRunningProcesses_v3": lambda h, c, a: pynvml.NVML_ERROR_NOT_SUPPORTED}
    pynvml._nvmlGetFunctionPointer = functions.__getitem__
    mine, other = (ctypes.cast(i, pynvml.c_nvmlDevice_t) for i in (1, 2))
    def figures(info):
        return [info.total // MiB, info.used // MiB, info.free // MiB] + ([info.reserved // MiB] if hasattr(info, "reserved") else [])
    out = {"wrapped": getattr(pynvml.nvmlDeviceGetMemoryInfo, "_gpushare", False),
           "v1": figures(pynvml.nvmlDeviceGetMemoryInfo(mine)),
           "v2": figures(pynvml.nvmlDeviceGetMemoryInfo(mine, version=pynvml.nvmlMemory_v2)),
           "other_card": figures(pynvml.nvmlDeviceGetMemoryInfo(other))}
    cards[1]["free"] = 200 * MiB
    out["card_nearly_full"] = figures(pynvml.nvmlDeviceGetMemoryInfo(mine))
    cards[1]["free"], _ = 70000 * MiB, unsupported.add("processes")
    out["no_process_list"] = figures(pynvml.nvmlDeviceGetMemoryInfo(mine))
    import jupyter_gpushare  # noqa: F401  (the server's package in this process: it must see the real card)
    out["server_process"] = figures(pynvml.nvmlDeviceGetMemoryInfo(mine))
    child.stdin.close()
    child.wait()
    print(json.dumps(out))
"""


def test_nvml_reports_the_reservation_and_the_kernels_use(tmp_path):
    """Through the real pynvml and its wrapper: on the kernel's card total is the reservation (quota + context
    reserve: NVML counts the CUDA context), used what the kernel's process tree holds (this process and its
    child, not the parent outside the kernel), free the rest, at most the card's real free; v2's driver-reserved
    share is not the kernel's. Another card, and a process that imported jupyter_gpushare (the server), see the
    driver's figures. The simulated card's fake NVML lives in the server process and never reaches a kernel, so
    the NVML library's C functions are replaced here under the real pynvml."""
    out = run_py(FAKE_DRIVER_NVML, gpu_env(tmp_path))
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    held = QUOTA + RESERVE
    assert got["wrapped"] is True
    assert got["v1"] == [held, 1800, held - 1800]
    assert got["v2"] == [held, 1800, held - 1800, 0]
    assert got["other_card"] == [81920, 81920 - 81000, 81000]
    assert got["card_nearly_full"] == [held, 1800, 200]
    assert got["no_process_list"] == [held, 0, held]  # used unknown: what is free within the reservation
    assert got["server_process"] == [81920, 81920 - 70000, 70000]
    (report,) = reports_of(tmp_path).values()
    assert report["views"] == ["pynvml.nvmlDeviceGetMemoryInfo"] and report["frameworks"] == {}

    out = run_py(
        "import pynvml\ntry:\n    pynvml.nvmlDeviceGetMemoryInfo(None)\nexcept pynvml.NVMLError as e:\n    print(type(e).__name__)",
        gpu_env(tmp_path),
    )
    assert out.stdout.strip() == "NVMLError_Uninitialized"  # the library's own error, as unwrapped


def test_the_report_carries_views_and_the_api_schema_has_them(tmp_path):
    """The server keeps only view names the bootstrap writes, merges them over the kernel's live processes, and
    the merged framework entry matches the published schema."""
    now = time.time()
    report = {
        "pid": 1,
        "started": None,
        "time": now,
        "frameworks": {"torch": {"capped": True, "limit_mib": 2048, "detail": "d", "views": ["torch.cuda.mem_get_info", "rm -rf", 3]}},
        "views": ["torch.cuda.mem_get_info", "pynvml.nvmlDeviceGetMemoryInfo", "x" * 600],
        "pulled_in": {"jax": "tensorflow", "torch": "jax", "cupy": "evil"},
    }  # fmt: skip
    clean = clean_report(report, "k")
    assert clean["frameworks"]["torch"]["views"] == ["torch.cuda.mem_get_info"]
    assert clean["views"] == ["pynvml.nvmlDeviceGetMemoryInfo", "torch.cuda.mem_get_info"]
    assert clean["pulled_in"] == {"jax": "tensorflow"}  # a listed framework is not also pulled in; unknown 'by' dropped
    import os

    (tmp_path / f"k.{os.getpid()}.json").write_text(json.dumps({**report, "pid": os.getpid(), "started": now}))
    merged = read_reports(str(tmp_path), "k")
    assert merged["views"] == clean["views"] and merged["pulled_in"] == {"jax": "tensorflow"}
    conforms(merged["frameworks"]["torch"], "Framework")
    assert merged["frameworks"]["torch"]["views"] == ["torch.cuda.mem_get_info"]
    assert CARD.total_mib == 81920  # (the card the figures above are of)
