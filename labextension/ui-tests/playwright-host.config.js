// Browser tests of the "This host" section against servers that tests/ui/test_ui.py starts (a real
// broker and Jupyter servers of several Unix users): no webServer here, the URLs come from the
// environment (see host-tests/host.spec.ts).
const base = require('./playwright.config.js');

module.exports = {
  ...base,
  testDir: './host-tests',
  use: { ...base.use, baseURL: undefined },
  webServer: undefined
};
