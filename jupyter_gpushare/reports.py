"""What the kernels say about their framework caps: read and remove their report files.

Every process of a kernel that imports a GPU framework (and the kernel process itself, at start)
writes ``<report_dir>/<kernel_id>.<pid>.json`` from the in-kernel bootstrap
(``bootstrap/_gpushare_boot.py``), atomically (temp file + ``os.replace``). Only the server reads
them, on its ledger worker thread.
"""

from __future__ import annotations

import json
import os
from typing import Any

import psutil

# A process started more than this long after the report's "started" time is not the one that
# wrote it (pid reuse). The bootstrap stamps "started" within milliseconds of interpreter start.
START_SLACK_S = 2.0


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
    limits = [e.get("limit_mib") for e, _ in entries if e.get("limit_mib") is not None]
    merged = {
        "capped": not uncapped,
        "limit_mib": max(limits) if limits and not uncapped else None,
        "detail": base.get("detail", ""),
    }
    if len(entries) > 1:
        merged["processes"] = len(entries)
    return merged


def read_reports(report_dir: str, kernel_id: str) -> dict[str, Any] | None:
    """Merge the reports of a kernel's live processes, or None when none has written one.

    Returns ``{"frameworks": {name: {"capped", "limit_mib", "detail"[, "processes"]}}, "warnings": [...],
    "processes": [{"pid", "root", "frameworks"}...], "time": latest}``. A framework is ``capped`` only
    if every process that imported it capped it; otherwise the entry explains the first that did not.
    Reports of processes that have exited (or whose pid now belongs to another process) are skipped,
    so a restarted kernel does not show what its previous process imported.
    """
    reports = []
    for path in _files(report_dir, kernel_id):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue  # removed meanwhile, or not ours to parse
        if not isinstance(data, dict) or data.get("kernel_id") not in (None, kernel_id):
            continue
        pid = data.get("pid")
        if not isinstance(pid, int) or not _alive(pid, data.get("started")):
            continue
        reports.append(data)
    if not reports:
        return None
    reports.sort(key=lambda r: (not r.get("root"), r.get("pid")))
    by_framework: dict[str, list[tuple[dict, bool]]] = {}
    warnings: list[str] = []
    for r in reports:
        for name, entry in (r.get("frameworks") or {}).items():
            if isinstance(entry, dict):
                by_framework.setdefault(name, []).append((entry, bool(r.get("root"))))
        for w in r.get("warnings") or []:
            if w not in warnings:
                warnings.append(w)
    return {
        "frameworks": {name: _merge(entries) for name, entries in sorted(by_framework.items())},
        "warnings": warnings,
        "processes": [
            {"pid": r["pid"], "root": bool(r.get("root")), "frameworks": sorted(r.get("frameworks") or {})}
            for r in reports
        ],
        "time": max(r.get("time") or 0 for r in reports),
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
