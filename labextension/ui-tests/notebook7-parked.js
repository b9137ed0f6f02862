// Notebook 7, issue 47's item 1 (run by tests/ui/test_notebook7.py): a parked notebook's CPU cell runs at once. Its
// kernel used 1 GiB of the (simulated) card and was parked; two other notebooks then took the card; a cell run from
// the page answers at once, with the kernel's variables, says in one line that the GPU comes back, while the kernel
// waits in line for its GPU; once one of the others leaves, the kernel is back. Prints one JSON line.
const { kernelAt, launch, until } = require('./notebook7-lib');

async function main() {
  const [url, executablePath] = process.argv.slice(2);
  const base = new URL(url).origin;
  const { browser, errors, newPage } = await launch(executablePath);
  const page = await newPage();
  const api = page.request;
  const kernelOf = path => kernelAt(api, base, path);
  const run = code =>
    page.evaluate(async code => {
      const kernel =
        window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      const future = kernel.requestExecute({ code });
      await future.done;
    }, code);

  await page.goto(url); // nb.ipynb
  await page.waitForFunction(
    () =>
      !!window.jupyterapp &&
      window.jupyterapp.commands.hasCommand('gpushare:open-panel') &&
      window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel
        ?.status === 'idle',
    null,
    { timeout: 60000 }
  );
  const rec = await until('nb.ipynb running', async () => {
    const k = await kernelOf('nb.ipynb');
    return k?.state === 'running' && k;
  });
  await run(
    "import gpushare_simulate; gpushare_simulate.use('1GiB'); kept = 7"
  );
  const parked = await api.post(
    `${base}/api/gpushare/kernels/${rec.kernel_id}/park`
  );
  if (!parked.ok()) {
    throw new Error(`park: ${parked.status()} ${await parked.text()}`);
  }
  await until(
    'nb.ipynb parked',
    async () => (await kernelOf('nb.ipynb'))?.state === 'parked'
  );
  const fillers = [];
  for (const path of ['f1.ipynb', 'f2.ipynb']) {
    const r = await api.post(`${base}/api/sessions`, {
      data: { path, type: 'notebook', name: path, kernel: { name: 'python3' } }
    });
    fillers.push((await r.json()).id);
  }
  await until('the card full', async () => {
    const kernels = (
      await (await api.get(`${base}/api/gpushare/kernels`)).json()
    ).kernels;
    return kernels.filter(k => k.state === 'running').length === 2;
  });

  // The student's next cell, from the page: its CPU work runs at once, and it says why the GPU is not there yet
  const cell = page.locator('.jp-NotebookPanel .jp-CodeCell').first();
  await cell.locator('.jp-InputArea-editor').click();
  await page.keyboard.type('print(kept + 1)');
  const sent = Date.now();
  await page.evaluate(() => {
    void window.jupyterapp.commands.execute('notebook:run-cell');
  });
  const output = cell.locator('.jp-OutputArea');
  const printed = await until('the cell output', async () => {
    const text = (await output.textContent()) || '';
    return /(^|\n)8(\n|$)/.test(text) && text;
  });
  const answeredS = (Date.now() - sent) / 1000;
  const stateThen = (await kernelOf('nb.ipynb'))?.state;
  await api.delete(`${base}/api/sessions/${fillers[0]}`);
  await until(
    'nb.ipynb back',
    async () => (await kernelOf('nb.ipynb'))?.state === 'running'
  );
  await browser.close();
  console.log(
    JSON.stringify({
      errors,
      printed,
      answered_s: answeredS,
      state_then: stateThen
    })
  );
  process.exit(errors.length ? 1 : 0);
}

main().catch(e => {
  console.error(e);
  process.exit(2);
});
