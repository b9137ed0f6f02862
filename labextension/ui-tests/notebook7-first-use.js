// Notebook 7 with line_place = 'first-use' (run by tests/ui/test_notebook7.py): a notebook's page shows its kernel
// holding no GPU yet (the toolbar's indicator and the panel say "GPU at first use"), a CPU cell leaves it so, and
// its first GPU import asks: the kernel then holds its reservation, in the same process. Prints one JSON line.
const { launch } = require('./notebook7-lib');

async function main() {
  const [url, executablePath] = process.argv.slice(2);
  const { browser, errors, newPage } = await launch(executablePath);
  const page = await newPage();
  await page.goto(url);
  await page.waitForFunction(
    () =>
      !!window.jupyterapp &&
      window.jupyterapp.commands.hasCommand('gpushare:open-panel'),
    null,
    { timeout: 60000 }
  );
  const kernelOf = async () =>
    page.evaluate(async () => {
      const kernels = (await (await fetch('/api/gpushare/kernels')).json())
        .kernels;
      return kernels.find(k => k.path === 'nb.ipynb') || null;
    });
  const run = code =>
    page.evaluate(async code => {
      const kernel =
        window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      let said = '';
      const future = kernel.requestExecute({ code });
      future.onIOPub = msg => {
        if (msg.header.msg_type === 'execute_result') {
          said = msg.content.data['text/plain'];
        }
      };
      await future.done;
      return said;
    }, code);
  const indicator = page.locator('.jp-gpushare-indicator');
  await indicator.waitFor({ timeout: 30000 });
  let indicatorText = '';
  for (let i = 0; i < 120 && !/first use/.test(indicatorText); i++) {
    indicatorText = (await indicator.textContent()) || '';
    await page.waitForTimeout(250);
  }
  await page.waitForFunction(
    () =>
      window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel
        ?.status === 'idle',
    null,
    { timeout: 60000 }
  );
  const before = await kernelOf();
  const cpu = await run('import os; os.getpid()');
  const afterCpu = await kernelOf();
  await page.evaluate(() =>
    window.jupyterapp.commands.execute('gpushare:open-panel')
  );
  const badge = page.locator(
    '#jp-gpushare .jp-gpushare-kernel[data-state="standby"] .jp-gpushare-badge'
  );
  await badge.waitFor({ timeout: 30000 });
  const badgeText = await badge.textContent();
  const gpu = await run(
    'import torch; os.getpid(), os.environ["GPUSHARE_MODE"], os.environ["GPUSHARE_QUOTA_MIB"]'
  );
  const after = await kernelOf();
  await browser.close();
  console.log(
    JSON.stringify({
      errors,
      indicator: indicatorText,
      badge: badgeText,
      before: before && before.state,
      after_cpu: afterCpu && afterCpu.state,
      cpu,
      gpu,
      after: after && after.state,
      quota_mib: after && after.quota_mib
    })
  );
  process.exit(errors.length ? 1 : 0);
}

main().catch(e => {
  console.error(e);
  process.exit(2);
});
