#!/usr/bin/env bash
# One session on the lent GPU machine, as a few back-to-back commands (the machine is given back ~30 s after
# a command, so nothing may sit between them). Each command names its steps, e.g.
#   bash bench/gpu/device_session.sh stash torch-study:1          (carry .tfgpu/00 and .whl)
#   bash bench/gpu/device_session.sh piece:01 torch-study:2       (carry .tfgpu/01)
#   bash bench/gpu/device_session.sh piece:09 tf check-views      (carry .tfgpu/09 and .whl-hf)
#   bash bench/gpu/device_session.sh tf check-tf:1
# Steps:
#   stash             ../shared/tools/tf-gpu's first piece, kept under /tmp (TensorFlow arrives in 10 pieces)
#   piece:NN          move TensorFlow's piece NN under /tmp/parts
#   tf                assemble TensorFlow once, then use it (source /tmp/tfgpu-env.sh)
#   torch-study:N     the study's PyTorch scenarios (growth and gpushare, 1.2x the jobs that fit), run N
#   study:NAME:RUNS[:EPOCHS[:RERUNS]]  the study with --runs RUNS written with '/' for ':' and '+' for ',' (e.g.
#                     tensorflow/growth/1.2+tensorflow/gpushare/1.2), results under $OUT/study-NAME; more harness
#                     options in $STUDY_ARGS (e.g. --learned-quota-mib 2908 for a generous scenario on its own)
#   check-tf:N        bench/gpu/check_tf.py, run N
#   check-learned:FWS:N  bench/gpu/check_learned.py for frameworks FWS ('+' between them), run N
#   check-park:CASES:N  bench/gpu/check_park.py for CASES ('+' between them), N runs each, under $OUT/park
#   check-views       bench/gpu/check_views.py (Accelerate/transformers from the carried .whl-hf)
# Everything goes to $OUT (the device tool brings it back); the Jupyter wheels come from .whl (device_env.sh).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpushare-out}
mkdir -p "$OUT"
source bench/gpu/device_env.sh || exit 1
export JUPYTER_DATA_DIR=${JUPYTER_DATA_DIR:-$(mktemp -d)} JUPYTER_RUNTIME_DIR=${JUPYTER_RUNTIME_DIR:-$(mktemp -d)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
rc=0
for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case "$step" in
  stash) bash .tfgpu/00/device.sh stash || rc=1 ;;
  piece:*) mv ".tfgpu/${step#piece:}"/part.* /tmp/parts/ && ls /tmp/parts | wc -l || rc=1 ;;
  tf)
    [ -f /tmp/tfgpu-env.sh ] || bash /tmp/tfgpu/device.sh assemble || rc=1
    source /tmp/tfgpu-env.sh
    python3 -c "import tensorflow as tf; print('TensorFlow', tf.__version__, tf.config.list_physical_devices('GPU'))" ;;
  torch-study:*)
    python3 bench/study/harness.py --out "$OUT/study-torch-run${step#torch-study:}" \
      --runs torch:growth:1.2,torch:gpushare:1.2 --workdir /tmp > "$OUT/study-torch-run${step#torch-study:}.log" 2>&1 || rc=1
    grep -E "^\[|device" "$OUT/study-torch-run${step#torch-study:}.log" ;;
  study:*)
    IFS=: read -r _ name runs epochs reruns <<< "$step"
    runs=${runs//\//:}
    python3 bench/study/harness.py --out "$OUT/study-$name" --runs "${runs//+/,}" --epochs "${epochs:-5}" --reruns "${reruns:-3}" \
      --workdir /tmp ${STUDY_ARGS:-} > "$OUT/study-$name.log" 2>&1 || rc=1
    grep -E "^\[|device" "$OUT/study-$name.log" ;;
  check-tf:*)
    python3 bench/gpu/check_tf.py "$OUT/check_tf-run${step#check-tf:}.json" > "$OUT/check_tf-run${step#check-tf:}.log" 2>&1 || rc=1
    grep -E "^(PASS|FAIL|baseline|peaks)" "$OUT/check_tf-run${step#check-tf:}.log" ;;
  check-learned:*)
    IFS=: read -r _ fws n <<< "$step"
    python3 bench/gpu/check_learned.py "$OUT/check_learned-${fws//+/-}-run$n.json" --frameworks "${fws//+/,}" \
      > "$OUT/check_learned-${fws//+/-}-run$n.log" 2>&1 || rc=1
    grep -E "^\[[a-z]+\] |^\{" "$OUT/check_learned-${fws//+/-}-run$n.log" ;;
  check-park:*)
    IFS=: read -r _ cases n <<< "$step"
    python3 bench/gpu/check_park.py "$OUT/park" --cases "${cases//+/,}" --runs "$n" > "$OUT/check_park-${cases//+/-}.log" 2>&1 || rc=1
    grep -E "^\{" "$OUT/check_park-${cases//+/-}.log" ;;
  check-views)
    if [ -d .whl-hf ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/hfsite .whl-hf/*.whl || rc=1
    fi
    PYTHONPATH="$PYTHONPATH:/tmp/hfsite" python3 bench/gpu/check_views.py "$OUT/check_views.json" > "$OUT/check_views.log" 2>&1 || rc=1
    grep -E "^(PASS|FAIL)" "$OUT/check_views.log" ;;
  *) echo "unknown step: $step"; rc=2 ;;
  esac
done
echo "=== done rc=$rc $(date -u +%H:%M:%S)"
exit $rc
