#!/bin/sh
# A JupyterLab for the browser tests: one simulated 10 GiB card, 3 GiB quotas + 512 MiB
# context reserve, no headroom, so two notebooks fit and a third waits in the queue. Workspaces and
# user settings live in the run's own folder, so no earlier run's open notebooks or theme come back.
# GPUSHARE_UI_ARGS: more options for a spec that needs other settings (playwright-enforce.config.js).
set -e
ROOT="${GPUSHARE_UI_ROOT:-$(mktemp -d -t gpushare-ui-XXXXXX)}"
mkdir -p "$ROOT"
PYTHON="${PYTHON:-python}"
exec "$PYTHON" -m jupyterlab --allow-root --no-browser \
  --ServerApp.ip=127.0.0.1 --ServerApp.port="${GPUSHARE_UI_PORT:-8899}" --ServerApp.port_retries=0 \
  --ServerApp.root_dir="$ROOT" \
  --LabApp.workspaces_dir="$ROOT/.lab/workspaces" --LabApp.user_settings_dir="$ROOT/.lab/user-settings" \
  --IdentityProvider.token= --ServerApp.password= --ServerApp.disable_check_xsrf=True \
  --LabApp.expose_app_in_browser=True --LabApp.news_url=None \
  --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
  --GpuShareApp.gpu_backend=simulated --GpuShareApp.simulated_cards=10GiB \
  --GpuShareApp.ledger_path="$ROOT/.gpushare/ledger.sqlite" \
  --GpuShareApp.default_quota=3GiB --GpuShareApp.context_reserve=512MiB \
  --GpuShareApp.card_headroom=0MiB --GpuShareApp.max_quota=6GiB ${GPUSHARE_UI_ARGS:-}
