// Browser tests of line_place = 'first-use': a notebook's kernel asks for its GPU at its first GPU import
// (start-lab.sh with GPUSHARE_UI_ARGS); tests/ui/test_ui.py runs them.
const base = require('./playwright.config.js');

const port = Number(process.env.GPUSHARE_UI_PORT || 8899);

module.exports = {
  ...base,
  testDir: './first-use-tests',
  webServer: {
    ...base.webServer,
    command:
      'GPUSHARE_UI_ARGS="--GpuShareApp.line_place=first-use" sh ./start-lab.sh',
    url: `http://127.0.0.1:${port}/lab`
  }
};
