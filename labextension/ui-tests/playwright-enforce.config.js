// Browser tests of what the over-quota policy does to a kernel, in a JupyterLab whose policy interrupts a
// kernel 2 s over its reservation (start-lab.sh with GPUSHARE_UI_ARGS); tests/ui/test_ui.py runs them.
const base = require('./playwright.config.js');

const port = Number(process.env.GPUSHARE_UI_PORT || 8899);

module.exports = {
  ...base,
  testDir: './enforce-tests',
  webServer: {
    ...base.webServer,
    command:
      'GPUSHARE_UI_ARGS="--GpuShareApp.over_quota_action=interrupt --GpuShareApp.over_quota_grace=2" sh ./start-lab.sh',
    url: `http://127.0.0.1:${port}/lab`
  }
};
