"""What the kernels say about their framework caps: read and remove their report files.

Every process of a kernel that imports a GPU framework (and the kernel process itself, at start)
writes ``<report_dir>/<kernel_id>.<pid>.json`` from the in-kernel bootstrap
(``bootstrap/_gpushare_boot.py``), atomically (temp file + ``os.replace``). Only the server reads
them, on a worker thread (never the ledger's), and only regular files of bounded size (``read_regular``).

A report is the kernel's word: code the student controls writes it, and may forge it. So each is
checked for shape here (known frameworks, bounded sizes and texts; anything else is dropped), the API
shows it as what the kernel reported, and nothing the server enforces (reservations, the over-quota
and idle policies) ever reads it.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import psutil
from jupyter_core.paths import jupyter_runtime_dir

from ..core.policy import FRAMEWORKS  # what the bootstrap caps; other names are not reported

# A process started more than this long after the report's "started" time is not the one that
# wrote it (pid reuse). The bootstrap stamps "started" within milliseconds of interpreter start.
START_SLACK_S = 2.0
PULLED_IN_BY = (*FRAMEWORKS, "keras")  # whose import may bring a framework in (bootstrap: OUTER_IMPORTS)
# The functions the bootstrap makes give the kernel's quota as the GPU's size (bootstrap/_gpushare_views.py).
VIEWS = (
    "cupy.cuda.Device.mem_info",
    "cupy.cuda.runtime.memGetInfo",
    "pynvml.nvmlDeviceGetMemoryInfo",
    "pynvml.nvmlDeviceGetMemoryInfo_v2",
    "torch.cuda.get_device_properties",
    "torch.cuda.mem_get_info",
)
MAX_REPORT_BYTES = 64 * 1024
MAX_TEXT, MAX_WARNINGS = 500, 20
MAX_LIMIT_MIB = 1 << 30
MAX_ALLOC_MIB = 1 << 21  # 2 TiB: a framework's peak in use (no card holds more)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # (not NaN)


def _views(value: Any) -> list[str]:
    """The known view names in ``value`` (a list), sorted; anything else is dropped."""
    return sorted({v for v in value if isinstance(v, str) and v in VIEWS}) if isinstance(value, list) else []


def _clean_entry(entry: Any) -> dict[str, Any] | None:
    """One framework entry of a report, with the fields and sizes the bootstrap writes; None if not one."""
    if not isinstance(entry, dict) or not isinstance(entry.get("capped"), bool):
        return None
    limit = entry.get("limit_mib")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= MAX_LIMIT_MIB):
        return None
    detail = entry.get("detail", "")
    out: dict[str, Any] = {
        "capped": entry["capped"],
        "limit_mib": limit if entry["capped"] else None,
        "detail": detail[:MAX_TEXT] if isinstance(detail, str) else "",
    }
    if isinstance(entry.get("version"), str):
        out["version"] = entry["version"][:40]
    if _views(entry.get("views")):
        out["views"] = _views(entry.get("views"))
    return out


def clean_report(data: Any, kernel_id: str) -> dict[str, Any] | None:
    """A report file's content in the shape the bootstrap writes, or None when it is not one (or not this
    kernel's). Unknown frameworks and fields are dropped; texts and lists are cut to bounded sizes."""
    if not isinstance(data, dict) or data.get("kernel_id") not in (None, kernel_id):
        return None
    pid, started = data.get("pid"), data.get("started")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not (started is None or _number(started)):
        return None
    frameworks: dict = data["frameworks"] if isinstance(data.get("frameworks"), dict) else {}
    pulled_in: dict = data["pulled_in"] if isinstance(data.get("pulled_in"), dict) else {}
    warnings: list = data["warnings"] if isinstance(data.get("warnings"), list) else []
    return {
        "pid": pid,
        "started": started,
        "root": data.get("root") is True,
        "time": data["time"] if _number(data.get("time")) else 0,
        "frameworks": {
            name: entry
            for name in FRAMEWORKS
            if name in frameworks and (entry := _clean_entry(frameworks[name])) is not None
        },
        "pulled_in": {
            name: pulled_in[name]
            for name in FRAMEWORKS
            if name not in frameworks and pulled_in.get(name) in PULLED_IN_BY and pulled_in[name] != name
        },
        "views": _views(data.get("views")),
        "warnings": [w[:MAX_TEXT] for w in warnings if isinstance(w, str)][:MAX_WARNINGS],
        "alloc": _alloc(data.get("alloc")),
        "oom": data["oom"] if data.get("oom") in FRAMEWORKS else None,
    }


def _alloc(value: Any) -> dict[str, int]:
    """The allocators' peaks in use (MiB by framework, ``bootstrap/_gpushare_alloc``); anything else dropped."""
    if not isinstance(value, dict):
        return {}
    return {
        name: mib
        for name in FRAMEWORKS
        if isinstance(mib := value.get(name), int) and not isinstance(mib, bool) and 0 < mib <= MAX_ALLOC_MIB
    }


def run_figures(report_dir: str, kernel_id: str, since: float | None) -> tuple[dict[str, int], str | None]:
    """What one run of a kernel reported for learning, read when it has ended: its processes' allocator peaks in
    use, summed by framework (each process has its own allocator), and the framework that ran out of memory
    (None: none did). A run's processes are those whose report says they started at or after ``since`` (the
    kernel process's creation time), alive or not; earlier runs' files are skipped."""
    alloc: dict[str, int] = {}
    oom = None
    for path in _files(report_dir, kernel_id):
        raw = read_regular(path, MAX_REPORT_BYTES)
        try:
            data = clean_report(json.loads(raw), kernel_id) if raw is not None else None
        except (ValueError, RecursionError):
            continue
        if data is None or (since is not None and (data["started"] or 0) < since - 1.0):
            continue
        for name, mib in data["alloc"].items():
            alloc[name] = alloc.get(name, 0) + mib
        oom = oom or data["oom"]
    return alloc, oom


def report_dir() -> str:
    """Where kernels write what their frameworks were capped at (read by the server)."""
    path = os.path.join(jupyter_runtime_dir(), "gpushare")
    os.makedirs(path, exist_ok=True)
    return path


def _files(report_dir: str, kernel_id: str) -> list[str]:
    prefix = f"{kernel_id}."
    try:
        names = os.listdir(report_dir)
    except OSError:
        return []
    return [
        os.path.join(report_dir, n)
        for n in names
        if n.startswith(prefix) and n.endswith(".json") and n[len(prefix) : -5].isdigit()
    ]


def read_regular(path: str, limit: int) -> bytes | None:
    """A small regular file's bytes, or None: opened without following a link and without blocking (a FIFO
    named like a report must not hang its reader), and read only if it is a regular file of at most ``limit``
    bytes. Student code can create anything in the report directory; nothing there may stall the server."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # gone, a link (ELOOP), or not ours to read
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return os.read(fd, limit + 1)[:limit]
    except OSError:
        return None
    finally:
        os.close(fd)


def _alive(pid: int, started: float | None) -> bool:
    try:
        created = psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return False
    return started is None or created <= started + START_SLACK_S


def _merge(entries: list[tuple[dict, bool]]) -> dict[str, Any]:
    """One entry for a framework seen in several processes: capped only if capped in every one."""
    root = [e for e, is_root in entries if is_root]
    uncapped = [e for e, _ in entries if not e.get("capped")]
    base = uncapped[0] if uncapped else (root[0] if root else entries[0][0])
    limits = [e["limit_mib"] for e, _ in entries if e.get("limit_mib") is not None]
    merged = {
        "capped": not uncapped,
        "limit_mib": max(limits) if limits and not uncapped else None,
        "detail": base.get("detail", ""),
    }
    if len(entries) > 1:
        merged["processes"] = len(entries)
    views = sorted({v for e, _ in entries for v in e.get("views", ())})
    if views:
        merged["views"] = views
    return merged


def read_reports(report_dir: str, kernel_id: str) -> dict[str, Any] | None:
    """Merge the reports of a kernel's live processes, or None when none has written one.

    Returns ``{"frameworks": {name: {"capped", "limit_mib", "detail"[, "processes", "views"]}},
    "pulled_in": {name: by}, "views": [...], "warnings": [...], "processes": [{"pid", "root", "frameworks"}...],
    "time": latest}``. A framework is ``capped`` only if every process that imported it capped it; otherwise
    the entry explains the first that did not. A framework that only another one's import brought in
    (TensorFlow imports JAX) is not in ``frameworks`` but in ``pulled_in``, with the one that brought it.
    ``views`` are the functions that give the kernel's quota as the GPU's size in some process.
    Reports of processes that have exited (or whose pid now belongs to another process) are skipped,
    so a restarted kernel does not show what its previous process imported.
    """
    reports = []
    for path in _files(report_dir, kernel_id):
        raw = read_regular(path, MAX_REPORT_BYTES)
        if raw is None:
            continue  # removed meanwhile, too large, a FIFO or a link
        try:
            data = clean_report(json.loads(raw), kernel_id)
        except (ValueError, RecursionError):
            continue  # not ours to parse
        if data is None or not _alive(data["pid"], data["started"]):
            continue
        reports.append(data)
    if not reports:
        return None
    reports.sort(key=lambda r: (not r["root"], r["pid"]))
    by_framework: dict[str, list[tuple[dict, bool]]] = {}
    warnings: list[str] = []
    pulled_in: dict[str, str] = {}
    for r in reports:
        for name, by in r["pulled_in"].items():
            pulled_in.setdefault(name, by)
        for name, entry in r["frameworks"].items():
            by_framework.setdefault(name, []).append((entry, r["root"]))
        for w in r["warnings"]:
            if w not in warnings and len(warnings) < MAX_WARNINGS:
                warnings.append(w)
    return {
        "oom": next((r["oom"] for r in reports if r["oom"]), None),
        "frameworks": {name: _merge(entries) for name, entries in sorted(by_framework.items())},
        "pulled_in": {name: by for name, by in sorted(pulled_in.items()) if name not in by_framework},
        "views": sorted({v for r in reports for v in r["views"]}),
        "warnings": warnings,
        "processes": [{"pid": r["pid"], "root": r["root"], "frameworks": sorted(r["frameworks"])} for r in reports],
        "time": max(r["time"] for r in reports),
    }


def remove_reports(report_dir: str, kernel_id: str) -> int:
    """Delete every report file of a kernel (when its reservation is released). Returns how many."""
    removed = 0
    for path in _files(report_dir, kernel_id):
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed
