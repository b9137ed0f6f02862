"""The in-kernel bootstrap, in real interpreters: start-up, hooks, framework caps and reports.

Every framework check runs the real (CPU) build: torch 2.13 CPU, tensorflow-cpu, jax CPU. What
only a CUDA build can show (the PyTorch allocator setting by version) uses a stand-in ``torch``
package of a few lines; the lent GPU machine checks the real thing (bench/gpu/check_caps.py).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.host.reports import read_reports, remove_reports
from jupyter_gpushare.launch.kernel_env import BOOTSTRAP_DIR, kernel_env
from jupyter_gpushare.ledger.ledger import Lease, ProcessRef
from jupyter_gpushare.server.records import Grant

CARD = Card(index=0, uuid="GPU-test-0", name="Test Card 80GB", total_mib=81920, simulated=False)
QUOTA = 2048


def boot_module(name: str = "_gpushare_boot"):
    """A bootstrap module, loaded into this process as sitecustomize loads it (not installed: no GPUSHARE env)."""
    if str(BOOTSTRAP_DIR) not in sys.path:
        sys.path.append(str(BOOTSTRAP_DIR))  # appended: our sitecustomize must not shadow anything here
    return importlib.import_module(name)


def gpu_env(tmp_path, card=CARD, **extra) -> dict[str, str]:
    """The environment the provisioner gives a kernel holding QUOTA MiB on ``card``."""
    lease = Lease("kern-1", card.uuid, card.index, QUOTA, 512, "me", "python3", ProcessRef.me(), None, time.time())
    reports = tmp_path / "reports"
    reports.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSHARE_", "XLA_", "TF_", "PYTORCH_", "CUPY_"))}
    env = {**base, **kernel_env(Grant("gpu", lease=lease, card=card), "kern-1", True, base, str(reports), 20480)}
    env.update(extra)
    return env


def run_py(
    code: str, env: dict[str, str], python: str = sys.executable, timeout: float = 180
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=os.path.abspath(os.sep),
    )  # not the repo: it holds jupyter_gpushare


def reports_of(tmp_path) -> dict[int, dict]:
    out = {}
    for path in (tmp_path / "reports").glob("kern-1.*.json"):
        data = json.loads(path.read_text())
        out[data["pid"]] = data
    return out


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


# -- start-up -------------------------------------------------------------------------------------


def test_bootstrap_imports_only_the_standard_library():
    """Nothing the bootstrap imports at start may come from outside the standard library; inside the
    hooks, only the framework being imported (already on its way in) may be touched."""
    frameworks = {"torch", "tensorflow", "jax", "jaxlib", "cupy"}
    for path in BOOTSTRAP_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                top_level = node in tree.body
                allowed = (
                    sys.stdlib_module_names
                    | {"__future__", "sitecustomize"}
                    | {p.stem for p in BOOTSTRAP_DIR.glob("_gpushare_*.py")}
                )
                assert top in allowed or (not top_level and top in frameworks), f"{path.name} imports {name}"


def test_kernel_without_the_package_still_gets_the_bootstrap(tmp_path):
    """A kernel environment that lacks jupyter-gpushare (a bare venv) runs the bootstrap from PYTHONPATH alone."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    out = run_py(
        """
        import json, sys
        try:
            import jupyter_gpushare
            has_pkg = True
        except ImportError:
            has_pkg = False
        boot = sys.modules.get("_gpushare_boot")
        print(json.dumps({"has_pkg": has_pkg, "booted": bool(boot and boot._installed), "finder": any(type(f).__name__ == "_Finder" for f in sys.meta_path)}))
        """,
        gpu_env(tmp_path),
        python=python,
    )
    assert out.returncode == 0, out.stderr
    assert last_json(out.stdout) == {"has_pkg": False, "booted": True, "finder": True}
    (root,) = reports_of(tmp_path).values()
    assert root["root"] is True and root["quota_mib"] == QUOTA and root["frameworks"] == {}


def test_shadowed_sitecustomize_still_runs(tmp_path):
    """The environment's own sitecustomize (further down sys.path) runs after ours; a broken one does not stop Python."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    env = gpu_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(theirs)])
    out = run_py(
        """
        import json, os, sys, sitecustomize
        print(json.dumps({"theirs": os.environ.get("THEIRS_RAN"), "module": sitecustomize.__file__, "boot": "_gpushare_boot" in sys.modules}))
        """,
        env,
    )
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    assert got["theirs"] == "yes" and got["boot"] is True
    assert got["module"] == str(theirs / "sitecustomize.py")

    (theirs / "sitecustomize.py").write_text("raise RuntimeError('broken site config')\n")
    out = run_py("import sys; print('_gpushare_boot' in sys.modules)", env)
    assert out.returncode == 0 and out.stdout.strip() == "True"
    assert "broken site config" in out.stderr


def test_outside_a_gpushare_kernel_nothing_is_installed(tmp_path):
    """The bootstrap directory on PYTHONPATH of some other process (no GPUSHARE_KERNEL_ID) changes nothing."""
    env = {k: v for k, v in gpu_env(tmp_path).items() if k != "GPUSHARE_KERNEL_ID"}
    out = run_py("import sys; print(any(type(f).__name__ == '_Finder' for f in sys.meta_path))", env)
    assert out.returncode == 0 and out.stdout.strip() == "False"
    assert reports_of(tmp_path) == {}


# -- the post-import hook itself --------------------------------------------------------------------


def test_hooks_run_around_the_import_and_never_break_it(tmp_path, monkeypatch):
    """pre runs before the module body, post after it with the module; the module sees its real loader;
    a failing hook is a warning and the import succeeds; the module's own ImportError is untouched."""
    boot = boot_module()
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / "gs_demo_ok.py").write_text(
        "import builtins\nbuiltins.GS_EVENTS.append(('body', type(__loader__).__name__))\n"
    )
    (pkg / "gs_demo_fail.py").write_text("VALUE = 1\n")
    (pkg / "gs_demo_broken.py").write_text("import gs_no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(pkg))
    import builtins

    events = builtins.GS_EVENTS = []
    boot.register(
        "gs_demo_ok",
        pre=lambda m: events.append(("pre", m.__name__)),
        post=lambda m: events.append(("post", m.__name__)),
    )
    import gs_demo_ok  # noqa: F401

    assert events == [("pre", "gs_demo_ok"), ("body", "SourceFileLoader"), ("post", "gs_demo_ok")]
    assert type(gs_demo_ok.__spec__.loader).__name__ == "SourceFileLoader"

    def bad(module):
        raise KeyError("boom")

    boot.register("gs_demo_fail", pre=bad, post=bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import gs_demo_fail
    assert gs_demo_fail.VALUE == 1
    assert [w.category.__name__ for w in caught] == ["GpuShareWarning", "GpuShareWarning"]
    assert "gs_demo_fail was imported without it" in str(caught[0].message)

    # A pre hook may return the rest of itself (the wait of a framework that imports while its kernel waits):
    # the body runs first, then that, then the later pre hooks (a framework's caps), then the post hooks
    (pkg / "gs_demo_first.py").write_text("import builtins\nbuiltins.GS_EVENTS.append('body')\n")
    events.clear()
    boot.register("gs_demo_first", pre=lambda m: (events.append("pre"), lambda m: events.append("rest"))[1])
    boot.register("gs_demo_first", pre=lambda m: events.append("caps pre"), post=lambda m: events.append("post"))
    import gs_demo_first  # noqa: F401

    assert events == ["pre", "body", "rest", "caps pre", "post"]

    boot.register("gs_demo_broken", post=lambda m: events.append("never"))
    with pytest.raises(ModuleNotFoundError) as err:
        import gs_demo_broken  # noqa: F401
    assert err.value.name == "gs_no_such_module_anywhere" and "never" not in events
    del builtins.GS_EVENTS


# -- frameworks, real CPU builds ----------------------------------------------------------------------


def test_tensorflow_and_keras_with_the_usual_notebook_cells(tmp_path):
    """import keras (TF backend) fires the TensorFlow hook; cuda_malloc_async is unset with a warning; the
    common set_memory_growth cell runs; on a machine without GPU the report says so instead of 'capped'."""
    env = gpu_env(tmp_path, TF_GPU_ALLOCATOR="cuda_malloc_async", KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    out = run_py(
        """
        import json, os, warnings
        warnings.simplefilter("always")
        import keras
        import tensorflow as tf
        gpus = tf.config.list_physical_devices('GPU')
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        # A notebook's own CPU logical devices still work (the wrapper only touches capped GPUs).
        cpu = tf.config.list_physical_devices('CPU')[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        print(json.dumps({"allocator": os.environ.get("TF_GPU_ALLOCATOR"), "gpus": len(gpus),
                          "cpus": len(tf.config.list_logical_devices('CPU')), "sum": float(tf.reduce_sum(tf.ones([3])))}))
        """,
        env,
    )
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    assert got == {"allocator": None, "gpus": 0, "cpus": 2, "sum": 3.0}
    assert "TF_GPU_ALLOCATOR=cuda_malloc_async was unset" in out.stderr
    (report,) = reports_of(tmp_path).values()
    tf_entry = report["frameworks"]["tensorflow"]
    assert tf_entry["capped"] is False and tf_entry["limit_mib"] is None
    assert "no GPU is visible to TensorFlow" in tf_entry["detail"]
    assert any("cuda_malloc_async" in w for w in report["warnings"])


def test_tensorflow_clamp_of_a_notebooks_logical_devices(tmp_path):
    """A notebook's GPU logical devices are lowered to fit the quota, in proportion; within it they are kept."""
    out = run_py(
        """
        import json, sys
        import tensorflow as tf, _gpushare_caps as caps
        C = tf.config.LogicalDeviceConfiguration
        big, note = caps.clamp_logical_devices([C(memory_limit=6000), C(memory_limit=2000)], 2048)
        fit, none = caps.clamp_logical_devices([C(memory_limit=1000), C(memory_limit=1000)], 2048)
        open_, note2 = caps.clamp_logical_devices([C(), C()], 2048)
        print(json.dumps({"big": [c.memory_limit for c in big], "note": note, "fit": [c.memory_limit for c in fit], "none": none,
                          "open": [c.memory_limit for c in open_], "note2": note2, "type": type(big[0]).__name__}))
        """,
        gpu_env(tmp_path, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    assert got["big"] == [1536, 512] and sum(got["big"]) <= QUOTA and "8000 MiB" in got["note"]
    assert got["fit"] == [1000, 1000] and got["none"] is None
    assert got["open"] == [1024, 1024] and "1024 MiB each" in got["note2"]
    assert got["type"] == "LogicalDeviceConfiguration"


def test_torch_cpu_build_and_subprocess_inherit(tmp_path):
    """import torch fires the hook without touching CUDA; a CPU build is reported as not capped, honestly;
    a child process (as !python train.py) inherits the bootstrap and writes its own report."""
    out = run_py(
        """
        import json, os, subprocess, sys
        import torch
        child = subprocess.run([sys.executable, "-c", "import torch, os; print(os.getpid())"], capture_output=True, text=True)
        print(json.dumps({"cuda_init": torch.cuda.is_initialized(), "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                          "child": int(child.stdout.strip()), "me": os.getpid()}))
        """,
        gpu_env(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    assert got["cuda_init"] is False and got["conf"] is None  # a CPU build gets no allocator setting
    reports = reports_of(tmp_path)
    assert set(reports) == {got["me"], got["child"]}
    me, child = reports[got["me"]], reports[got["child"]]
    assert me["root"] is True and child["root"] is False and child["ppid"] == got["me"]
    for r in (me, child):
        torch_entry = r["frameworks"]["torch"]
        assert torch_entry["capped"] is False and "CPU-only build" in torch_entry["detail"]
        assert torch_entry["version"].startswith("2.13")


STAND_IN_TORCH = """
import os
__version__ = {version!r}
class _Version:
    cuda = "12.8"
version = _Version()
class OutOfMemoryError(RuntimeError):
    pass
class _Cuda:
    OutOfMemoryError = OutOfMemoryError
    queued = []
    def is_initialized(self):
        return False
    def _lazy_call(self, fn):
        self.queued.append(fn)
cuda = _Cuda()
CONF_AT_IMPORT = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
"""


@pytest.mark.parametrize("version", ["2.11.0+cu128", "2.4.1+cu121"])
def test_torch_cuda_build_gets_the_setting_its_version_accepts(tmp_path, version):
    """A CUDA torch new enough gets per_process_memory_fraction appended to PYTORCH_CUDA_ALLOC_CONF before it
    starts (the user's keys kept); an older one keeps its config (it rejects unknown keys) and gets the deferred
    set_per_process_memory_fraction instead. Stand-in torch: the CUDA build cannot run here."""
    pkg = tmp_path / "standin" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_IN_TORCH.format(version=version))
    (pkg / "version.py").write_text(f"__version__ = {version!r}\ncuda: Optional[str] = '12.8'\n")
    env = gpu_env(tmp_path, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "standin")
    out = run_py(
        "import torch, json; print(json.dumps({'conf': torch.CONF_AT_IMPORT, 'queued': len(torch.cuda.queued)}))", env
    )
    assert out.returncode == 0, out.stderr
    got = last_json(out.stdout)
    (report,) = reports_of(tmp_path).values()
    entry = report["frameworks"]["torch"]
    assert entry["capped"] is True and entry["limit_mib"] == QUOTA
    fraction = f"{QUOTA / CARD.total_mib:.6f}"
    if version.startswith("2.11"):
        assert got == {"conf": f"expandable_segments:True,per_process_memory_fraction:{fraction}", "queued": 0}
        assert "PYTORCH_CUDA_ALLOC_CONF per_process_memory_fraction" in entry["detail"]
    else:
        assert got == {"conf": "expandable_segments:True", "queued": 1}
        assert "deferred to CUDA initialisation" in entry["detail"]


def test_alloc_conf_merge():
    """The user's allocator keys stay; a larger fraction of their own is lowered with a note, a smaller one kept."""
    merge = boot_module("_gpushare_caps").merge_alloc_conf
    assert merge("", "0.025") == ("per_process_memory_fraction:0.025", None)
    assert (
        merge("max_split_size_mb:128, expandable_segments:True", "0.025")[0]
        == "max_split_size_mb:128,expandable_segments:True,per_process_memory_fraction:0.025"
    )
    lowered, note = merge("per_process_memory_fraction:0.5,expandable_segments:True", "0.025")
    assert lowered == "per_process_memory_fraction:0.025,expandable_segments:True" and "lowered" in note
    assert merge("per_process_memory_fraction:0.01", "0.025") == ("per_process_memory_fraction:0.01", None)


def test_jax_settings_are_checked_and_a_real_oom_gets_the_note(tmp_path):
    """A notebook's larger XLA memory fraction is lowered to the quota, in the one variable every jaxlib reads; a real JAX RESOURCE_EXHAUSTED error in a
    script keeps its traceback and is followed by the note with the quota and what to do."""
    env = gpu_env(tmp_path, XLA_CLIENT_MEM_FRACTION="0.9")
    out = run_py(
        """
        import os, sys
        import jax, jax.numpy as jnp
        sys.stdout.write(os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] + " " + str(os.environ.get("XLA_CLIENT_MEM_FRACTION")) + "\\n")
        sys.stdout.flush()
        jnp.zeros((2**44,), dtype=jnp.uint8).block_until_ready()
        """,
        env,
    )
    assert out.returncode == 1
    # one variable only: recent jaxlib will not start on the GPU with both set
    assert out.stdout.strip() == f"{QUOTA / CARD.total_mib:.6f} None"
    assert "XLA_CLIENT_MEM_FRACTION=0.9 was lowered" in out.stderr
    trace, _, note = out.stderr.partition("[jupyter-gpushare] JAX ran out of memory.")
    assert "Traceback (most recent call last)" in trace and "RESOURCE_EXHAUSTED" in trace
    assert f"quota is 2 GiB on {CARD.name}" in note and "at most 20 GiB on this server" in note
    (report,) = reports_of(tmp_path).values()
    assert report["frameworks"]["jax"]["capped"] is False and "no CUDA plugin" in report["frameworks"]["jax"]["detail"]


def test_oom_detection_is_specific():
    """Only the frameworks' out-of-memory errors get the note, also when wrapped in another exception."""
    boot = boot_module("_gpushare_oom")
    generic = type("XlaRuntimeError", (RuntimeError,), {})
    assert boot.oom_framework(generic("RESOURCE_EXHAUSTED: Out of memory")) == "jax"
    assert boot.oom_framework(generic("INVALID_ARGUMENT: shapes")) is None
    assert boot.oom_framework(MemoryError()) is None
    try:
        try:
            raise generic("RESOURCE_EXHAUSTED: x")
        except RuntimeError as inner:
            raise ValueError("training failed") from inner
    except ValueError as outer:
        assert boot.oom_framework(outer) == "jax"


# -- the server's side of the report contract ------------------------------------------------------------


def _write(dirpath, kernel_id, pid, started, frameworks, root=False):
    data = {
        "pid": pid,
        "kernel_id": kernel_id,
        "root": root,
        "started": started,
        "time": time.time(),
        "frameworks": frameworks,
        "warnings": [f"w{pid}"],
    }
    (dirpath / f"{kernel_id}.{pid}.json").write_text(json.dumps(data))


def test_read_reports_merges_live_processes_only(tmp_path):
    """A framework is 'capped' only if every live process of the kernel capped it; exited processes and reused
    pids are ignored; other kernels' files are not read; remove_reports deletes this kernel's files only."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        now = time.time()
        capped = {"capped": True, "limit_mib": 2048, "detail": "env"}
        _write(tmp_path, "k", os.getpid(), now, {"torch": capped, "jax": capped}, root=True)
        _write(
            tmp_path,
            "k",
            child.pid,
            now,
            {"torch": {"capped": False, "limit_mib": None, "detail": "not capped: CPU build"}},
        )
        _write(tmp_path, "k", dead.pid, now, {"cupy": capped})
        _write(tmp_path, "k", 1, now - 10**6, {"tensorflow": capped})  # pid 1 started long after this report
        _write(tmp_path, "other", os.getpid(), now, {"cupy": capped})
        (tmp_path / ".k.99.tmp").write_text("{partial")
        got = read_reports(str(tmp_path), "k")
        assert set(got["frameworks"]) == {"torch", "jax"}
        assert got["frameworks"]["jax"] == capped
        assert got["frameworks"]["torch"] == {
            "capped": False,
            "limit_mib": None,
            "detail": "not capped: CPU build",
            "processes": 2,
        }
        assert [p["pid"] for p in got["processes"]] == [os.getpid(), child.pid]
        assert read_reports(str(tmp_path), "nobody") is None
        assert remove_reports(str(tmp_path), "k") == 4
        assert sorted(p.name for p in tmp_path.iterdir()) == [".k.99.tmp", f"other.{os.getpid()}.json"]
    finally:
        child.kill()
        child.wait()


def _oldest_python() -> str | None:
    """A Python 3.9 interpreter that runs (pyenv shims on PATH may name one that is not active)."""
    import glob
    import shutil

    for candidate in [
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python"))),
        shutil.which("python3.9"),
    ]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(_oldest_python() is None, reason="no Python 3.9 interpreter on this machine")
def test_bootstrap_on_the_oldest_python_and_cupy_limit(tmp_path):
    """The bootstrap runs on Python 3.9 (the oldest the package supports), and a CuPy limit the notebook raised
    past the quota is lowered before CuPy reads it (stand-in cupy: CuPy needs CUDA to install)."""
    (tmp_path / "standin" / "cupy").mkdir(parents=True)
    (tmp_path / "standin" / "cupy" / "__init__.py").write_text(
        "import os\nLIMIT = os.environ.get('CUPY_GPU_MEMORY_LIMIT')\n"
    )
    env = gpu_env(tmp_path, CUPY_GPU_MEMORY_LIMIT="50%")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "standin")
    out = run_py("import sys, cupy; print(sys.version_info[:2], cupy.LIMIT)", env, python=_oldest_python())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["(3,", "9)", str(QUOTA * 2**20)]
    assert "CUPY_GPU_MEMORY_LIMIT=50% was lowered" in out.stderr
    (report,) = reports_of(tmp_path).values()
    assert report["frameworks"]["cupy"] == {
        "capped": True,
        "limit_mib": QUOTA,
        "detail": f"CUPY_GPU_MEMORY_LIMIT={QUOTA * 2**20} bytes (CuPy's default memory pool)",
    }


def test_a_packages_version_is_read_from_the_one_distribution_that_ships_it(tmp_path):
    """What decides whether TensorFlow imports while its kernel waits: its version, read before its import from
    the installed distribution (tensorflow, tensorflow-cpu, tf-nightly) whose top_level.txt lists it."""
    rep = boot_module("_gpushare_report")

    def site(*dists: tuple[str, str]):
        root = tmp_path / f"site{len(list(tmp_path.iterdir()))}"
        (root / "tensorflow").mkdir(parents=True)
        for name, top in dists:
            (root / f"{name}.dist-info").mkdir()
            (root / f"{name}.dist-info" / "top_level.txt").write_text(top)
        module = type(sys)("tensorflow")
        module.__spec__ = importlib.util.spec_from_file_location(
            "tensorflow", root / "tensorflow" / "__init__.py", submodule_search_locations=[str(root / "tensorflow")]
        )
        return rep.dist_version(module)

    assert site(("tensorflow_cpu-2.21.0", "tensorflow\n"), ("keras-3.15.1", "keras\n")) == "2.21.0"
    assert site(("tf_nightly-2.22.0.dev20261101", "tensorflow\n")) == "2.22.0.dev20261101"
    assert site(("tensorflow-2.21.0", "tensorflow\n"), ("tensorflow_cpu-2.20.0", "tensorflow\n")) is None
    assert site(("keras-3.15.1", "keras\n")) is None  # none ships it
    assert site(("tensorflow-2.21.0", "tensorflow\n"), ("tensorflow_intel-2.21.0", "tensorflow\n")) == "2.21.0"


def test_a_waiting_cells_code_hashes_as_the_sidebar_hashes_it():
    """The sidebar finds a held cell by this hash (labextension/test/heldcell.test.ts has the same three)."""
    wait = boot_module("_gpushare_wait")
    cases = {"": "811c9dc5", "import torch": "8c1b558e", 'x = "é→🙂"\nprint(x)': "3b9b98f8"}
    assert {code: wait.code_hash(code) for code in cases} == cases


def test_a_waiting_cells_line_changes_with_its_place_not_with_the_cards_room():
    """The walk of issue 47: a held cell's line said "128 MiB unreserved" while the banner said 1.1 GiB. The line is
    printed again only when it changes, so it says what stays true until then: no unreserved room in it."""
    wait = boot_module("_gpushare_wait")
    place = {"position": 2, "need_mib": 4608, "gives_up_at": 1_800_000_000}
    before, after = (wait._said("torch", {**place, "free_mib": mib}) for mib in (128, 1126))
    assert before == after and "unreserved" not in before
    assert before.startswith("jupyter-gpushare: PyTorch waits for this kernel's GPU: #2 in line, needs 4.5 GiB, gives")
    assert wait._said("torch", {**place, "position": 1}) != before
