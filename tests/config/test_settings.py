"""One set of settings, read the same way by every entry point, and checked as a whole at start.

What must hold: the server, `jupyter gpushare status` and `doctor`, and a kernel that `jupyter execute`
starts through the provisioner read the same files and agree (a bad value is refused by each with the
setting's name); status and doctor also see what the user's running server was started with on its command
line, and say where each setting came from; settings that cannot work together on this host's cards stop
the server (and the broker) at start with the settings involved and a fix.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import nbformat
import pytest
from servers import SimulatedServer
from traitlets import TraitError

from jupyter_gpushare.config.settings import GpuShareApp, settings_from
from jupyter_gpushare.config.sources import load_config
from jupyter_gpushare.core.policy import PolicyError

pytestmark = pytest.mark.server  # starts jupyter servers as processes (README: the quick subset)


@pytest.fixture
def home(tmp_path):
    """A user's Jupyter directories, with a jupyter_server_config.py of GpuShareApp settings."""
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.py").write_text(
        textwrap.dedent(
            f"""
            c.GpuShareApp.gpu_backend = "simulated"
            c.GpuShareApp.simulated_cards = "12GiB"
            c.GpuShareApp.default_quota = "3GiB"
            c.GpuShareApp.card_headroom = "0MiB"
            c.GpuShareApp.ledger_path = {str(tmp_path / "ledger.sqlite")!r}
            """
        )
    )
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_DEFAULT_PROVISIONER_NAME": "gpushare-provisioner",
    }
    return tmp_path, env, config / "jupyter_server_config.py"


def run(env, *args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*args], env=env, capture_output=True, text=True, timeout=180, cwd=cwd)


def test_jupyter_execute_status_and_doctor_read_the_servers_settings(home):
    tmp_path, env, config = home
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("import os; print(os.environ['GPUSHARE_QUOTA_MIB'])"))
    nbformat.write(nb, tmp_path / "nb.ipynb")
    out = run(env, "jupyter", "execute", "--inplace", "nb.ipynb", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert nbformat.read(tmp_path / "nb.ipynb", 4).cells[0].outputs[0]["text"].strip() == "3072"
    assert f"settings from {config}" in out.stderr  # and it says where they came from
    status = run(env, sys.executable, "-m", "jupyter_gpushare.cli.main", "status", "--json")
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert view["cards"][0]["total_mib"] == 12288 and view["cards"][0]["simulated"]
    assert str(config) in view["settings_from"]

    with open(config, "a") as f:
        f.write('c.GpuShareApp.default_quota = "4"\n')
    why = "GpuShareApp.default_quota: '4' is not a size: add a unit"
    out = run(env, "jupyter", "execute", "nb.ipynb", cwd=tmp_path)
    assert out.returncode != 0 and why in out.stderr
    doctor = run(env, sys.executable, "-m", "jupyter_gpushare.cli.main", "doctor")
    assert doctor.returncode == 1 and why in doctor.stdout and str(config) in doctor.stdout
    status = run(env, sys.executable, "-m", "jupyter_gpushare.cli.main", "status")
    assert status.returncode == 2 and why in status.stderr


def test_status_and_doctor_see_what_the_running_server_was_started_with(tmp_path):
    """The quick start gives the simulated card on `jupyter lab`'s command line: status and doctor find it."""
    server = SimulatedServer(tmp_path, "--GpuShareApp.simulated_cards=20GiB")
    env = {**os.environ, **{k: str(tmp_path / k.split("_")[1].lower()) for k in ("JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR")}}  # fmt: skip
    try:
        server.wait_ready()
        status = run(env, sys.executable, "-m", "jupyter_gpushare.cli.main", "status", "--json")
        assert status.returncode == 0, status.stderr
        view = json.loads(status.stdout)
        assert view["cards"][0]["total_mib"] == 20480 and view["cards"][0]["simulated"]
        assert f"the running Jupyter server (pid {server.proc.pid})" in view["settings_from"]
        doctor = run(env, sys.executable, "-m", "jupyter_gpushare.cli.main", "doctor")
        assert doctor.returncode == 0, doctor.stdout
        assert "[WARN ] cards: 0: Simulated GPU (no real memory) 20 GiB [simulated: no real memory]" in doctor.stdout
        assert f"the running Jupyter server (pid {server.proc.pid})" in doctor.stdout
    finally:
        server.stop()
    status = run(
        env, sys.executable, "-m", "jupyter_gpushare.cli.main", "status", "--json"
    )  # stopped: not read any more
    assert "running Jupyter server" not in " ".join(json.loads(status.stdout)["settings_from"])


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--GpuShareApp.cards=7"], "GpuShareApp.cards names ['7'], which no card of this host is"),
        (
            ["--GpuShareApp.default_quota=4GiB", "--GpuShareApp.max_quota=2GiB"],
            "GpuShareApp.max_quota (2 GiB) is less than GpuShareApp.default_quota (4 GiB)",
        ),
        (
            ["--GpuShareApp.default_quota=20GiB"],
            "GpuShareApp.default_quota: A quota of 20 GiB does not fit on any card",
        ),
        (
            ["--GpuShareApp.kernel_quotas={'big': '64GiB'}"],
            "GpuShareApp.kernel_quotas['big']: A quota of 64 GiB does not fit on any card",
        ),
        (["--GpuShareApp.min_quota=1GiB", "--GpuShareApp.default_quota=512MiB"], "less than GpuShareApp.min_quota"),
    ],
    ids=["no-such-card", "max-below-default", "default-past-every-card", "kernelspec-past-every-card", "below-min"],
)
def test_settings_that_cannot_work_together_stop_the_server_at_start(tmp_path, args, expect):
    server = SimulatedServer(tmp_path, *args)
    try:
        assert server.proc.wait(60) != 0
        assert expect in server.output(), server.output()[-2000:]
    finally:
        server.stop()


def test_the_broker_checks_its_settings_as_a_whole_too(tmp_path):
    from traitlets.config import Config

    from jupyter_gpushare.broker.server import GpuShareBroker

    c = Config({"GpuShareApp": {"gpu_backend": "simulated", "simulated_cards": "10GiB", "cards": ["3"]}})
    c.GpuShareBroker.ledger_path = str(tmp_path / "ledger.sqlite")
    with pytest.raises(PolicyError, match=r"GpuShareApp.cards names \['3'\], which no card of this host is"):
        GpuShareBroker(config=c).setup()


def test_a_bad_value_is_refused_where_it_is_read_with_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    (tmp_path / "jupyter_server_config.json").write_text(json.dumps({"GpuShareApp": {"queue_timeout": -5}}))
    config, sources = load_config()
    assert sources == [str(tmp_path / "jupyter_server_config.json")]
    with pytest.raises(PolicyError, match=r"GpuShareApp.queue_timeout: -5(\.0)? is not a time"):
        settings_from(config)


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("warm_kernels", -1, "GpuShareApp.warm_kernels: -1 is not a number of warm kernels; use 0 to 32"),
        ("warm_kernels", 10_000, "GpuShareApp.warm_kernels: 10000 is not a number of warm kernels"),
        ("warm_imports", ["jax"], "GpuShareApp.warm_imports: 'jax' is a GPU framework"),
        ("warm_imports", ["numba.cuda"], "GpuShareApp.warm_imports: 'numba.cuda' is a GPU framework"),
        ("warm_imports", ["tensorflow.keras"], "GpuShareApp.warm_imports: 'tensorflow.keras' is a GPU framework"),
        ("warm_imports", ["numpy; import os"], "GpuShareApp.warm_imports: 'numpy; import os' is not a module's name"),
    ],
)
def test_warm_kernel_settings_refuse_what_cannot_work(setting, value, said):
    with pytest.raises(TraitError, match=re.escape(said)):
        GpuShareApp(**{setting: value})


def test_warm_imports_take_modules_that_are_not_gpu_frameworks():
    assert GpuShareApp(warm_imports=["numpy", "numba", "matplotlib.pyplot"]).warm_imports == [
        "numpy",
        "numba",
        "matplotlib.pyplot",
    ]


def test_warm_imports_take_pytorch_alone_of_the_gpu_frameworks():
    assert GpuShareApp(warm_imports=["numpy", "torch"]).warm_imports == ["numpy", "torch"]
    with pytest.raises(TraitError, match="only torch may be imported warm"):
        GpuShareApp(warm_imports=["torch.cuda"])


def _bootstraps(name: str) -> tuple:
    from jupyter_gpushare.launch.kernel_env import BOOTSTRAP_DIR

    line = next(
        line for line in (BOOTSTRAP_DIR / "_gpushare_wait.py").read_text().splitlines() if line.startswith(f"{name} =")
    )
    return eval(line.split("=", 1)[1].split("#")[0])


def test_gpu_imports_are_the_bootstraps_waits_and_keras_and_warm_ones_its_warm_first():
    from jupyter_gpushare.core.policy import GPU_IMPORTS, WARM_FRAMEWORKS

    assert set(GPU_IMPORTS) == {*_bootstraps("WAITS"), "keras"}
    assert WARM_FRAMEWORKS == _bootstraps("WARM_FIRST")
