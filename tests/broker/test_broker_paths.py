"""Paths a student can prepare (hardening, round two, item 2): the root broker refuses a ledger directory or a
socket directory that another user owns or may write, and a ledger file that is a link, and says why and where
to put them instead. Real directories, real ownership (root changes it), a real broker set-up."""

from __future__ import annotations

import os

import pytest
from traitlets.config import Config

from jupyter_gpushare.broker import GpuShareBroker
from jupyter_gpushare.ledger.file import LedgerError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
STUDENT = 12345


def broker_at(ledger_path, socket_path=None) -> GpuShareBroker:
    c = Config()
    c.GpuShareApp.gpu_backend, c.GpuShareApp.simulated_cards = "simulated", "10GiB"
    c.GpuShareBroker.ledger_path = str(ledger_path)
    if socket_path:
        c.GpuShareBroker.socket_path = str(socket_path)
    broker = GpuShareBroker(config=c)
    broker.setup()
    return broker


@needs_root
def test_a_ledger_directory_a_student_owns_is_refused(tmp_path):
    prepared = tmp_path / "lib"
    prepared.mkdir(mode=0o755)
    os.chown(prepared, STUDENT, STUDENT)
    with pytest.raises(LedgerError, match=f"belongs to uid {STUDENT}.*/var/lib/jupyter-gpushare"):
        broker_at(prepared / "ledger.sqlite")._open_ledger()
    assert not (prepared / "ledger.sqlite").exists()


@needs_root
def test_a_parent_others_may_write_is_refused_unless_sticky(tmp_path):
    open_parent = tmp_path / "open"
    (open_parent / "lib").mkdir(parents=True)
    os.chmod(open_parent, 0o777)  # anyone may rename lib away and put their own in its place
    with pytest.raises(LedgerError, match="writable by other users \\(mode 777\\)"):
        broker_at(open_parent / "lib" / "ledger.sqlite")._open_ledger()
    os.chmod(open_parent, 0o1777)  # as /tmp: no one may move what another put there
    ledger = broker_at(open_parent / "lib" / "ledger.sqlite")._open_ledger()
    ledger.close()


@needs_root
def test_a_linked_lock_file_is_refused_not_chmodded(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir(mode=0o755)
    target = tmp_path / "roots-file"
    target.write_text("root's")
    os.chmod(target, 0o644)
    os.symlink(target, lib / "ledger.sqlite.lock")
    with pytest.raises(LedgerError, match="is a link or not a regular file"):
        broker_at(lib / "ledger.sqlite")._open_ledger()
    assert oct(target.stat().st_mode & 0o777) == "0o644"


@needs_root
def test_a_socket_directory_a_student_could_bind_in_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    os.chown(run, STUDENT, STUDENT)
    broker = broker_at(tmp_path / "lib" / "ledger.sqlite", run / "broker.sock")
    with pytest.raises(SystemExit, match=f"socket's directory .* belongs to uid {STUDENT}.*/run/jupyter-gpushare"):
        broker._prepare_socket()


def test_a_ledger_on_a_filesystem_students_can_fill_is_said(tmp_path, caplog):
    """A student who fills /tmp's filesystem makes every reserve fail (refused with the reason, never
    overbooked): the broker says so at start when its ledger shares that filesystem, and doctor too."""
    from jupyter_gpushare.broker.paths import fillable_by_students
    from jupyter_gpushare.cli.doctor import _ledger_disk_finding

    shared = fillable_by_students(tmp_path / "lib" / "ledger.sqlite", (str(tmp_path),))
    assert shared == str(tmp_path)
    assert fillable_by_students(tmp_path / "lib" / "ledger.sqlite", ("/proc",)) is None
    broker = broker_at(tmp_path / "lib" / "ledger.sqlite")
    broker.log.addHandler(caplog.handler)  # (the broker's log does not propagate)
    with caplog.at_level("WARNING"):
        broker._open_ledger().close()
    if fillable_by_students(tmp_path):  # (tmp_path is under /tmp on every machine this runs on)
        assert "which students can fill" in caplog.text
        finding = _ledger_disk_finding(str(tmp_path / "lib" / "ledger.sqlite"))
        assert finding.status == "info" and "every reservation is refused" in finding.detail
