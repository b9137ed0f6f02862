#!/bin/sh
# The class walk of issue 32 in Chromium, as a new user meets it: the README's JupyterLab (simulated 24 GiB card,
# default quota), ten notebooks from one page (labextension/ui-tests/class-walk.js). Writes OUT_DIR/class-walk.json
# and a screenshot.   sh bench/ui_class_walk.sh OUT_DIR
set -e
OUT="$1"; mkdir -p "$OUT"
ROOT=$(mktemp -d); PORT=${PORT:-8933}
python -m jupyterlab --allow-root --no-browser --GpuShareApp.simulated_cards=24GiB \
  --ServerApp.port="$PORT" --ServerApp.root_dir="$ROOT" --IdentityProvider.token= --ServerApp.password= \
  --LabApp.expose_app_in_browser=True --LabApp.news_url=None --ServerApp.disable_check_xsrf=True \
  --LabApp.workspaces_dir="$ROOT/.ws" --LabApp.user_settings_dir="$ROOT/.us" \
  --GpuShareApp.ledger_path="$ROOT/ledger.sqlite" > "$OUT/server.log" 2>&1 &
LAB=$!
trap 'kill $LAB' EXIT
for i in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/api/status" >/dev/null && break; sleep 1; done
cd "$(dirname "$0")/../labextension/ui-tests"
node class-walk.js "http://127.0.0.1:$PORT" "${CHROMIUM:-/usr/bin/chromium}" "$OUT" > "$OUT/class-walk.json"
cat "$OUT/class-walk.json"
