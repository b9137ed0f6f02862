"""The names of a kernel's GPUSHARE_* environment, for both sides: ``kernel_env.py`` (in the server) sets them,
the bootstrap's modules (in the kernel and its children) read them. No imports: it runs in every kernel.

A value is text; sizes are whole MiB.
"""

KERNEL_ID = "GPUSHARE_KERNEL_ID"
MODE = "GPUSHARE_MODE"  # gpu (a reservation), cpu (without a GPU: REASON says why), none (no quota), queued (in line),
# standby (nothing asked yet: its first GPU use asks, line_place = 'first-use'), warm (started ahead of time: no
# notebook's yet, its GPU hidden; a hand-over through its grant pipe makes it one, in one of the other modes)
REASON = "GPUSHARE_REASON"
GRANT_FD = "GPUSHARE_GRANT_FD"  # queued: the pipe its place in line and then its grant come through (held.py)
ASK_FD = "GPUSHARE_ASK_FD"  # standby: the pipe its first GPU use asks through, once (held.py)
REPORT_DIR = "GPUSHARE_REPORT_DIR"  # where the kernel's processes write their reports (reports.py reads them)
ROOT_PID = "GPUSHARE_ROOT_PID"  # the kernel's own process, set by the bootstrap ("" from the server)
QUOTA_MIB = "GPUSHARE_QUOTA_MIB"  # what the frameworks are capped at
RESERVE_MIB = "GPUSHARE_RESERVE_MIB"  # the CUDA context reserve, beside the quota
MAX_QUOTA_MIB = "GPUSHARE_MAX_QUOTA_MIB"  # the largest quota a kernel may have on its card
RETRY_QUOTA_MIB = "GPUSHARE_RETRY_QUOTA_MIB"  # what to restart with after running out of memory
PEAK_BEFORE_MIB = "GPUSHARE_PEAK_BEFORE_MIB"  # what earlier runs of the kernel's notebook peaked at (NVML)
LEARNS = "GPUSHARE_LEARNS"  # "1": the notebook's next quota learns from this run
CARD_UUID = "GPUSHARE_CARD_UUID"
CARD_INDEX = "GPUSHARE_CARD_INDEX"
CARD_NAME = "GPUSHARE_CARD_NAME"
CARD_TOTAL_MIB = "GPUSHARE_CARD_TOTAL_MIB"
SIMULATED = "GPUSHARE_SIMULATED"  # "1": a simulated card, no real GPU memory
TORCH_FRACTION = "GPUSHARE_TORCH_FRACTION"  # the quota as a fraction of the card (PyTorch's cap)
WARM_IMPORTS = "GPUSHARE_WARM_IMPORTS"  # warm: the modules it imports before its hand-over, comma-separated
