"""`jupyter gpushare status` and `jupyter gpushare doctor`, run as real commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_gpushare.core.policy import Policy, parse_size
from jupyter_gpushare.host.gpu import Card
from jupyter_gpushare.ledger.ledger import Ledger, ProcessRef, Request

CARDS = [Card(0, "GPU-simulated-0", "Simulated GPU (no real memory)", 10240, simulated=True)]


@pytest.fixture
def env(tmp_path):
    """An isolated Jupyter config dir holding a config with simulated cards, and its ledger path."""
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    ledger = tmp_path / "ledger" / "ledger.sqlite"
    (config_dir / "jupyter_server_config.py").write_text(
        textwrap.dedent(
            f"""
            c.GpuShareApp.gpu_backend = "simulated"
            c.GpuShareApp.simulated_cards = "10GiB"
            c.GpuShareApp.card_headroom = "0MiB"
            c.GpuShareApp.context_reserve = "512MiB"
            c.GpuShareApp.ledger_path = {str(ledger)!r}
            """
        )
    )
    return {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "LEDGER": str(ledger),
        "CONFIG": str(config_dir / "jupyter_server_config.py"),
    }


def gpushare(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_gpushare.cli.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


def fill(path: str) -> list[str]:
    ledger = Ledger(path)
    policy = Policy(context_reserve_mib=512, headroom=parse_size("0MiB"))
    ids = []
    for i, quota in enumerate(("2GiB", "3GiB")):
        lease = ledger.reserve(Request(f"kernel-{i}", parse_size(quota), "alice", "python3"), policy, CARDS, wait=False)
        ledger.attach(lease.kernel_id, ProcessRef.me())
        ids.append(lease.kernel_id)
    ledger.close()
    return ids


def test_status_reads_the_local_ledger_as_json_and_as_tables(env):
    ids = fill(env["LEDGER"])
    out = gpushare(env, "status", "--json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["source"] == f"ledger {env['LEDGER']}"
    assert [k["kernel_id"] for k in view["kernels"]] == ids
    card = view["cards"][0]
    assert (card["total_mib"], card["reserved_mib"], card["unreserved_mib"]) == (10240, 2560 + 3584, 10240 - 6144)
    assert card["used_mib"] == 0 and view["kernels"][0]["used_mib"] == 0  # simulated cards: nothing runs on them
    table = gpushare(env, "status")
    assert table.returncode == 0
    assert view["kernels"][0]["card_label"] == card["label"] == "GPU 0" and "GPU 0" in table.stdout
    for text in ("CARDS", "KERNELS", "QUEUE", "IN USE", "kernel-0", "kernel-1", "6 GiB", "3 GiB", "[simulated]"):
        assert text in table.stdout, text


def test_status_says_when_the_broker_is_not_reachable(env, tmp_path):
    out = gpushare(env, "status", "--socket", str(tmp_path / "nobody.sock"))
    assert out.returncode == 2
    assert "is not reachable" in out.stderr and "systemctl status jupyter-gpushare-broker" in out.stderr
    assert out.stderr.count("is not reachable") == 1  # said once, not logged again


def test_doctor_passes_a_good_setup_and_names_every_tier(env):
    fill(env["LEDGER"])
    out = gpushare(env, "doctor", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    found = {f["check"]: f for f in json.loads(out.stdout)}
    assert found["config"]["status"] == "ok"
    assert (
        found["ledger"]["status"] == "ok"
        and "integrity ok" in found["ledger"]["detail"]
        and "2 reservation(s)" in found["ledger"]["detail"]
    )
    assert found["cards"]["status"] == "warn" and "simulated" in found["cards"]["detail"]
    for tier in ("framework caps", "NVML watchdog", "MPS", "driver cgroup limits"):
        assert f"tier: {tier}" in found
    assert "nvidia-cuda-mps-control" in found["tier: MPS"]["detail"]
    assert all(f["fix"] for f in found.values() if f["status"] in ("warn", "error"))


def test_doctor_reports_a_bad_setting_with_its_name_and_fails(env):
    with open(env["CONFIG"], "a") as f:
        f.write('c.GpuShareApp.default_quota = "4"\n')
    out = gpushare(env, "doctor")
    assert out.returncode == 1
    assert "[ERROR] config: GpuShareApp.default_quota: '4' is not a size: add a unit" in out.stdout
    assert "what to do:" in out.stdout


def test_doctor_finds_a_damaged_ledger_and_an_absent_broker(env, tmp_path):
    os.makedirs(os.path.dirname(env["LEDGER"]))
    with open(env["LEDGER"], "wb") as f:
        f.write(b"this is not a database" * 100)
    out = gpushare(env, "doctor", "--json")
    assert out.returncode == 1
    found = {f["check"]: f for f in json.loads(out.stdout)}
    assert found["ledger"]["status"] == "error" and ".bad" in found["ledger"]["fix"]
    out = gpushare(env, "doctor", "--json", "--socket", str(tmp_path / "nobody.sock"))
    found = {f["check"]: f for f in json.loads(out.stdout)}
    assert out.returncode == 1 and found["broker"]["status"] == "error" and "systemctl start" in found["broker"]["fix"]


def test_jupyter_dispatches_to_the_console_script(env, tmp_path):
    """`jupyter gpushare ...` runs the `jupyter-gpushare` script that pyproject declares."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    scripts = tomllib.loads((Path(__file__).parent.parent.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["jupyter-gpushare"] == "jupyter_gpushare.cli.main:main"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "jupyter-gpushare"  # what pip writes for that entry point, in short
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom jupyter_gpushare.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", "gpushare", "k8s-profiles", "--whole-gpu", "--format", "json"],
        env={**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["singleuser"]["profileList"][1]["slug"] == "gpu-whole"


def test_status_lists_gpu_processes_without_a_reservation_to_admins_only():
    """An admin sees which processes use GPU memory outside any kernel (who runs a script in a terminal);
    a student's view names no other user's process."""
    from jupyter_gpushare.broker import Caller
    from jupyter_gpushare.cli.status import add_use, format_status
    from jupyter_gpushare.host.gpu import SimulatedBackend
    from jupyter_gpushare.ledger.ledger import Lease
    from jupyter_gpushare.ledger.view import view_for

    backend = SimulatedBackend([10240])
    card = backend.cards()[0]
    kernel, script = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "61"])
    try:
        backend.fake.add_process(kernel.pid, 1000)
        backend.fake.add_process(script.pid, 3000)
        lease = Lease(
            "k1", card.uuid, 0, 2048, 512, "alice", "python3", ProcessRef.me(), ProcessRef.of(kernel.pid), 0.0
        )
        for admin in (True, False):
            caller = Caller("root", 0, admin=True) if admin else Caller("alice", 1001)
            view = add_use({"source": "test", **view_for(caller, [lease], [], [card], Policy())}, backend)
            text = format_status(view)
            if admin:
                assert view["kernels"][0]["used_mib"] == 1000
                outside = [(p["card_label"], p["pid"], p["used_mib"], p["command"]) for p in view["outside"]]
                assert outside == [("GPU 0", script.pid, 3000, "sleep 61")] and view["outside"][0]["user"]
                assert "GPU PROCESSES WITHOUT A RESERVATION" in text and "sleep 61" in text
            else:
                assert "outside" not in view and "sleep 61" not in text and str(script.pid) not in text
    finally:
        kernel.kill()
        script.kill()


def test_status_and_doctor_list_what_each_notebook_taught(env):
    """Issue 24, item 3: admins read the recorded peaks and learned quotas per notebook, not the SQLite file."""
    from jupyter_gpushare.core.history import HistoryRules, Run

    ids = fill(env["LEDGER"])
    ledger = Ledger(env["LEDGER"])
    ledger.record_peak(ids[0], "week1/cnn.ipynb", Run(2900, 2600), HistoryRules())
    ledger.record_peak(ids[1], "week2/big.ipynb", Run(3500, 4608, failed=True), HistoryRules())
    ledger.close()
    view = json.loads(gpushare(env, "status", "--json").stdout)
    books = {n["path"]: n for n in view["notebooks"]}
    assert (books["week1/cnn.ipynb"]["peak_mib"], books["week1/cnn.ipynb"]["quota_mib"]) == (2900, 2600)
    assert (books["week2/big.ipynb"]["quota_mib"], books["week2/big.ipynb"]["failed"]) == (4608, True)
    table = gpushare(env, "status").stdout
    assert "NOTEBOOKS WITH RECORDED RUNS" in table and "week2/big.ipynb" in table and "4.5 GiB" in table
    doctor = gpushare(env, "doctor").stdout
    assert "2 notebook(s) have recorded runs" in doctor and "1 ran out of memory on a run" in doctor


def test_options_lists_every_setting_with_its_value_here_and_its_default(env):
    """`jupyter lab --help-all` shows no GpuShareApp option: `jupyter gpushare options` lists them all, each with
    the value the config files (and the command line) give it here, its default and its help."""
    from jupyter_gpushare.broker.server import GpuShareBroker
    from jupyter_gpushare.config.settings import GpuShareApp

    out = gpushare(env, "options", "--GpuShareApp.queue_timeout=90", "--broker")
    assert out.returncode == 0, out.stderr
    listed = {line.split(" = ")[0] for line in out.stdout.splitlines() if line.startswith("GpuShare")}
    assert listed == {f"GpuShareApp.{n}" for n in GpuShareApp.class_traits(config=True)} | {
        f"GpuShareBroker.{n}" for n in GpuShareBroker.class_traits(config=True)
    }
    assert "GpuShareApp.queue_timeout = 90.0 (set; default 600.0)" in out.stdout
    assert "GpuShareApp.park_after = 600.0\n" in out.stdout  # not set here: its default alone
    assert env["CONFIG"] in out.stdout.splitlines()[0]  # where the settings came from


def test_options_says_which_value_an_option_refuses(env):
    out = gpushare(env, "options", "--GpuShareApp.queue_timeout=abc")
    assert out.returncode == 2 and out.stdout == ""
    assert "jupyter gpushare options: The 'queue_timeout' trait" in out.stderr and "'abc'" in out.stderr
