// What the Notebook 7 checks share (notebook7-*.js, run by tests/ui/test_notebook7.py): Debian's Chromium with
// pages that note their errors, and a wait for a condition.
const { chromium } = require('playwright-core');

// Notebook 7.6.5 throws this from its own settings code on every notebook page, also with this extension disabled
// (notebook7-check.js says how that was checked); it is not ours.
const NOT_OURS = /Cannot read properties of undefined \(reading 'schema'\)/;

/** Chromium, and ``newPage()``: a page whose errors (not Notebook 7's own) go into ``errors``. */
async function launch(executablePath) {
  const browser = await chromium.launch({
    executablePath,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking']
  });
  const errors = [];
  const newPage = async () => {
    const page = await browser.newPage();
    page.on(
      'pageerror',
      e => NOT_OURS.test(String(e)) || errors.push(`pageerror: ${e.stack || e}`)
    );
    return page;
  };
  return { browser, errors, newPage };
}

/** ``fn()``'s first truthy value, asked every 250 ms; an error naming ``what`` after ``timeout`` ms. */
async function until(what, fn, timeout = 60000) {
  const end = Date.now() + timeout;
  for (;;) {
    const value = await fn();
    if (value) {
      return value;
    }
    if (Date.now() > end) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise(r => setTimeout(r, 250));
  }
}

/** The server's record of the kernel of the notebook at ``path`` (GET /api/gpushare/kernels), or null. */
async function kernelAt(api, base, path) {
  const kernels = (await (await api.get(`${base}/api/gpushare/kernels`)).json())
    .kernels;
  return kernels.find(k => k.path === path) || null;
}

module.exports = { NOT_OURS, kernelAt, launch, until };
