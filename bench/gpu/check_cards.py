"""The NVML backend's card list and sampling on a real GPU, and what NVML answers to the MIG queries
it makes (so the fake NVML's MIG behaviour can be compared with a real driver's).

    python3 bench/gpu/check_cards.py out.json      # on the GPU machine, from the repo root (PYTHONPATH=.)

Checks: every card NVML lists is a card of the backend (with MIG off: the whole GPU, NVML's index and
UUID); a PyTorch process holding 2 GiB is sampled on its card by pid, also after the backend drops its
handle (found again by UUID); the MIG queries' answers on each GPU (a whole GPU's GPU instance ID
included, which only MIG devices have).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timezone

import pynvml

from jupyter_gpushare.host.gpu.nvml import NvmlBackend

HOLD = "import torch, time; x = torch.ones(2 * 2**30 // 4, device='cuda'); print('ready', flush=True); time.sleep(60)"


def answer(fn, *args):
    try:
        value = fn(*args)
        return {"value": value if isinstance(value, (int, list, str)) else repr(value)}
    except pynvml.NVMLError as e:
        return {"error": str(e)}


def main(path: str) -> int:
    pynvml.nvmlInit()
    raw = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        raw.append({
            "index": i,
            "uuid": pynvml.nvmlDeviceGetUUID(h),
            "name": pynvml.nvmlDeviceGetName(h),
            "total_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
            "mig_mode": answer(pynvml.nvmlDeviceGetMigMode, h),
            "max_mig_device_count": answer(pynvml.nvmlDeviceGetMaxMigDeviceCount, h),
            "mig_device_handle_slot_0": answer(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0),
            "gpu_instance_id": answer(pynvml.nvmlDeviceGetGpuInstanceId, h),
            "handle_by_uuid_same": pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(h)) is not None,
        })  # fmt: skip
    backend = NvmlBackend()
    cards = backend.cards()
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        time.sleep(1)
        first = backend.sample()
        backend._handles.clear()  # as after a lost card: found again by UUID
        again = backend.sample()
    finally:
        holder.kill()
        holder.wait()

    def seen(samples):
        return [{"card": s.card.uuid, "mig": s.mig, "used_mib": s.used_mib, "holder_mib": next((p.used_mib for p in s.processes if p.pid == holder.pid), None), "errors": s.errors} for s in samples]  # fmt: skip

    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "nvml_devices": raw,
        "backend_cards": [c.to_dict() for c in cards],
        "sample": seen(first),
        "sample_after_handles_dropped": seen(again),
    }
    checks = {
        "every_device_is_a_card": [(c.index, c.uuid) for c in cards] == [(d["index"], d["uuid"]) for d in raw],
        "whole_gpus_are_labelled_by_index": all(c.label == f"GPU {c.index}" for c in cards if c.mig_instance is None),
        "holder_seen": any(s["holder_mib"] and s["holder_mib"] >= 2048 for s in result["sample"]),
        "holder_seen_again_by_uuid": any(s["holder_mib"] and s["holder_mib"] >= 2048 for s in result["sample_after_handles_dropped"]),
    }  # fmt: skip
    result["checks"] = checks
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
