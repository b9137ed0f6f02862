#!/usr/bin/env bash
# The idle study on the lent GPU, the code before a change and after it, side by side in one call:
#   [FACTOR=2] [PARK_AFTER=S] [CPU_STUDENTS=8 [CPU_EPOCHS=50]] bash bench/gpu/idle_pair.sh N before after   (carry .whl first)
# Each side is CODE or CODE:LINE_PLACE (after:first-use: this checkout, GpuShareApp.line_place 'first-use').
# "before" runs the package copied under bench/gpu/before/ (git archive REV jupyter_gpushare | tar -x -C there),
# "after" this checkout's. Each run: PyTorch, FACTOR (default 4) times the kernels that fit, each runs its job,
# idles 60 s, runs it again; parking after PARK_AFTER (default 1) s idle; CPU_STUDENTS more students run a NumPy job (no GPU) the same
# way. Results under $OUT/study-idle<FACTOR>x-<side>-runN.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpushare-out}
mkdir -p "$OUT"
source bench/gpu/device_env.sh || exit 1
n=$1; shift
factor=${FACTOR:-4}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
# The page cache warmed once for both sides: the machine's first PyTorch import reads its libraries from disk, and
# the side run first paid it in its first wave (about 5 s: wave 1 took 23 s, the later ones 18 s, 2026-11-27).
python3 -c "import torch; torch.ones(1, device='cuda'); print('warm:', torch.__version__)"
for side in "$@"; do
  which=${side%%:*}
  place=start; [ "$side" != "$which" ] && place=${side#*:}
  export JUPYTER_DATA_DIR=$(mktemp -d) JUPYTER_RUNTIME_DIR=$(mktemp -d)
  # (python -m puts the working directory first on sys.path: the server runs the package found there)
  if [ "$which" = before ]; then dir="$ROOT/bench/gpu/before"; else dir="$ROOT"; fi
  export PYTHONPATH="$dir:/tmp/site"
  name="study-idle${factor}x-${side/:/-}-run$n"
  echo "=== $name $(date -u +%H:%M:%S) $(cd "$dir" && python3 -c 'import jupyter_gpushare; print(jupyter_gpushare.__file__)')"
  (cd "$dir" && python3 "$ROOT/bench/study/harness.py" --out "$OUT/$name" --runs torch:parking:$factor --fit 8 --epochs 2 \
    --reruns 3 --workdir /tmp --idle 60 --park-after ${PARK_AFTER:-1} --line-place $place --cpu-students ${CPU_STUDENTS:-0} \
    --cpu-epochs ${CPU_EPOCHS:-50} > "$OUT/$name.log" 2>&1)
  grep -E "^\[|device" "$OUT/$name.log" | tail -3
done
