// Notebook 7 smoke check (run by tests/ui/test_notebook7.py): open a notebook page in Debian's
// Chromium, and check that the extension activates without errors, the kernel gets its quota,
// and the GPU panel opens. Prints one JSON line; exits non-zero on failure.
const { chromium } = require('playwright-core');

async function main() {
  const [url, executablePath] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath,
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync'
    ]
  });
  const page = await browser.newPage();
  const errors = [];
  // Notebook 7.6.5 throws this from its own settings code on every notebook page, also with this
  // extension disabled (checked with page_config.json disabledExtensions); it is not ours.
  const notOurs = /Cannot read properties of undefined \(reading 'schema'\)/;
  page.on(
    'pageerror',
    e => notOurs.test(String(e)) || errors.push(`pageerror: ${e.stack || e}`)
  );
  page.on('console', m => {
    if (m.type() === 'error' && !/favicon|404 \(Not Found\)/.test(m.text())) {
      errors.push(`console: ${m.text()}`);
    }
  });
  await page.goto(url);
  await page.waitForFunction(
    () =>
      !!window.jupyterapp &&
      window.jupyterapp.commands.hasCommand('gpushare:open-panel'),
    null,
    { timeout: 60000 }
  );
  // The notebook's kernel starts; the server's API shows its reservation.
  let rec = null;
  for (let i = 0; i < 120 && !rec; i++) {
    const kernels = await page.evaluate(
      async () => (await (await fetch('/api/gpushare/kernels')).json()).kernels
    );
    rec = kernels.find(k => k.state === 'running') || null;
    if (!rec) {
      await page.waitForTimeout(500);
    }
  }
  if (!rec) {
    throw new Error('no kernel got a GPU quota within 60 s');
  }
  // Notebook 7 has no status bar: the notebook's toolbar carries the indicator
  const indicator = page.locator('.jp-gpushare-indicator');
  await indicator.waitFor({ timeout: 30000 });
  let indicatorText = '';
  for (let i = 0; i < 60 && !/^GPU .* \/ /.test(indicatorText); i++) {
    indicatorText = (await indicator.textContent()) || '';
    await page.waitForTimeout(250);
  }
  await page.evaluate(() =>
    window.jupyterapp.commands.execute('gpushare:open-panel')
  );
  await page.waitForSelector('#jp-gpushare .jp-gpushare-kernel', {
    timeout: 30000
  });
  const panelText = await page.locator('#jp-gpushare').innerText();
  await browser.close();
  console.log(
    JSON.stringify({
      errors,
      quota_mib: rec.quota_mib,
      path: rec.path,
      indicator: indicatorText,
      panel: panelText.slice(0, 2000)
    })
  );
  process.exit(errors.length ? 1 : 0);
}

main().catch(e => {
  console.error(e);
  process.exit(2);
});
