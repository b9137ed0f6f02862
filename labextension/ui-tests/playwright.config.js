// Browser tests of the GPU sidebar. They use the system Chromium (no browser download):
// CHROMIUM=/path overrides /usr/bin/chromium. The server is started by start-lab.sh.
const port = Number(process.env.GPUSHARE_UI_PORT || 8899);

module.exports = {
  testDir: './tests',
  timeout: 120 * 1000,
  expect: { timeout: 30 * 1000 },
  workers: 1,
  retries: 0,
  reporter: [['list']],
  use: {
    baseURL: `http://127.0.0.1:${port}`,
    viewport: { width: 1280, height: 860 },
    trace: 'off',
    actionTimeout: 30 * 1000,
    video: 'off',
    screenshot: 'only-on-failure',
    launchOptions: {
      executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-dev-shm-usage',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync'
      ]
    }
  },
  webServer: {
    command: `sh ./start-lab.sh`,
    url: `http://127.0.0.1:${port}/lab`,
    timeout: 120 * 1000,
    reuseExistingServer: false,
    stdout: 'ignore',
    stderr: 'pipe'
  }
};
