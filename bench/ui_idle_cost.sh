#!/bin/sh
# The page's idle cost with eight notebooks waiting (issue 47, item 7), in Chromium, side by side in one run: the
# same JupyterLab with the extension (a simulated 4 GiB card, 3 GiB quotas: one kernel runs, eight wait) and
# without it (server extension off, sidebar disabled, jupyter_client's own provisioner). Each: nine notebooks
# open in one page, the sidebar closed, 60 s untouched (labextension/ui-tests/idle-cost.js). Writes
# OUT_DIR/idle-cost.json.   sh bench/ui_idle_cost.sh OUT_DIR
set -e
OUT="$1"; mkdir -p "$OUT"
HERE="$(cd "$(dirname "$0")" && pwd)"
run_lab() {  # $1: with|without; the lab's pid in $LAB
  ROOT=$(mktemp -d); PORT=$2
  mkdir -p "$ROOT/.cfg/labconfig"
  if [ "$1" = without ]; then
    echo '{"disabledExtensions": {"jupyter-gpushare": true}}' > "$ROOT/.cfg/labconfig/page_config.json"
    EXTRA="--ServerApp.jpserver_extensions=jupyter_gpushare=False"
    export JUPYTER_DEFAULT_PROVISIONER_NAME=local-provisioner
  else
    EXTRA="--GpuShareApp.gpu_backend=simulated --GpuShareApp.simulated_cards=4GiB --GpuShareApp.default_quota=3GiB --GpuShareApp.card_headroom=0MiB --GpuShareApp.ledger_path=$ROOT/ledger.sqlite"
    unset JUPYTER_DEFAULT_PROVISIONER_NAME
  fi
  JUPYTER_CONFIG_DIR="$ROOT/.cfg" python -m jupyterlab --allow-root --no-browser --ServerApp.port="$PORT" \
    --ServerApp.root_dir="$ROOT" --IdentityProvider.token= --ServerApp.password= --LabApp.news_url=None \
    --LabApp.expose_app_in_browser=True --ServerApp.disable_check_xsrf=True --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
    --LabApp.workspaces_dir="$ROOT/.ws" --LabApp.user_settings_dir="$ROOT/.us" $EXTRA > "$OUT/server-$1.log" 2>&1 &
  LAB=$!
  for i in $(seq 90); do curl -sf "http://127.0.0.1:$PORT/api/status" >/dev/null && break; sleep 1; done
}
for which in with without; do
  run_lab "$which" 8941
  (cd "$HERE/../labextension/ui-tests" && node idle-cost.js "http://127.0.0.1:8941" "${CHROMIUM:-/usr/bin/chromium}" "$LAB") > "$OUT/$which.json" || { kill $LAB; exit 1; }
  kill $LAB; wait $LAB 2>/dev/null || true
done
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
w, wo = (json.load(open(f"{out}/{n}.json")) for n in ("with", "without"))
result = {"with": w, "without": wo,
          "requests_ratio": round(w["requests_per_min"] / max(wo["requests_per_min"], 1e-9), 2),
          "browser_cpu_ratio": round(w["browser_core_pct"] / max(wo["browser_core_pct"], 1e-9), 2)}
json.dump(result, open(f"{out}/idle-cost.json", "w"), indent=1)
print(json.dumps({k: result[k] for k in ("requests_ratio", "browser_cpu_ratio")}),
      f"with: {w['requests_per_min']:.0f} req/min, {w['browser_core_pct']:.1f}% of a core (states {w['kernel_states']});",
      f"without: {wo['requests_per_min']:.0f} req/min, {wo['browser_core_pct']:.1f}%")
PY
