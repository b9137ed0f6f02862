// The class walk of issue 32, repeated in Chromium as a new user would meet it: the README's JupyterLab (a
// simulated 24 GiB card, the default quota), ten notebooks opened from one page, each with a GPU cell. Prints one
// JSON object of what it saw; run by bench/ui_class_walk.sh, which starts the lab.
//
//   node class-walk.js URL CHROMIUM OUT_DIR
const { chromium } = require('playwright-core');
const path = require('path');

const N = 10;
const run = (page, command, args = {}) =>
  page.evaluate(
    ([c, a]) => window.jupyterapp.commands.execute(c, a),
    [command, args]
  );
const { api, putNotebook } = require('./page-api');
const T0 = Date.now();
const step = what =>
  console.error(`${((Date.now() - T0) / 1000).toFixed(1)} s: ${what}`);
const kernels = async page => (await api(page, '/api/gpushare/state')).kernels;

async function main() {
  const [url, executablePath, out] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath,
    args: ['--no-sandbox', '--disable-gpu']
  });
  const page = await browser.newPage({
    viewport: { width: 1280, height: 860 }
  });
  const errors = [];
  page.on('pageerror', e => errors.push(String(e)));
  await page.goto(`${url}/lab?reset`);
  await page.waitForFunction(
    () => window.jupyterapp?.commands.hasCommand('gpushare:open-panel'),
    null,
    { timeout: 120000 }
  );
  const seen = { errors };
  for (let i = 1; i <= N; i++) {
    await api(page, `/api/contents/walk${i === 1 ? '' : ''}`, {
      method: 'PUT',
      body: JSON.stringify({ type: 'directory' })
    });
  }
  for (let i = 1; i <= N; i++) {
    await putNotebook(page, `walk/nb${String(i).padStart(2, '0')}.ipynb`, [
      'import torch\n',
      "print('ran', torch.__version__)"
    ]);
  }
  step("await run(page, 'gpushare:open-panel');");
  await run(page, 'gpushare:open-panel');
  const t0 = Date.now();
  for (let i = 1; i <= N; i++) {
    await run(page, 'docmanager:open', {
      path: `walk/nb${String(i).padStart(2, '0')}.ipynb`,
      factory: 'Notebook'
    });
  }
  let ks = [];
  for (let i = 0; i < 240; i++) {
    ks = await kernels(page);
    if (
      ks.length === N &&
      ks.every(k => ['running', 'idle', 'queued'].includes(k.state))
    )
      break;
    await page.waitForTimeout(500);
  }
  seen.open_all_s = (Date.now() - t0) / 1000;
  seen.running = ks.filter(k => k.state !== 'queued').length;
  seen.waiting = ks.filter(k => k.state === 'queued').length;
  step('// The file browser while they wait');
  // The file browser while they wait
  seen.contents_ms = [];
  for (let i = 0; i < 5; i++) {
    const t = Date.now();
    await api(page, '/api/contents/walk?content=1');
    seen.contents_ms.push(Date.now() - t);
  }
  step('// Every waiting notebook in front');
  // Every waiting notebook in front, one after the other: its banner, the status bar, the sidebar's badge and
  // JupyterLab's own kernel status say the server's place
  seen.disagreements = [];
  for (const k of ks.filter(k => k.state === 'queued')) {
    await run(page, 'docmanager:open', { path: k.path, factory: 'Notebook' });
    await page.waitForTimeout(700);
    const now = (await kernels(page)).find(x => x.kernel_id === k.kernel_id);
    const place = `#${now.position} in line`;
    const said = await page.evaluate(name => {
      const front = document.querySelector(
        '.jp-NotebookPanel:not(.lm-mod-hidden)'
      );
      const banner =
        front?.querySelector('.jp-gpushare-banner-text')?.textContent ?? '';
      const status =
        document.querySelector('.jp-gpushare-status')?.textContent ?? '';
      const card = Array.from(
        document.querySelectorAll('#jp-gpushare .jp-gpushare-kernel')
      ).find(c => c.querySelector('.jp-gpushare-link')?.textContent === name);
      const badge =
        card?.querySelector('.jp-gpushare-badge')?.textContent ?? '';
      const note =
        Array.from(document.querySelectorAll('#jp-main-statusbar *'))
          .map(e => getComputedStyle(e, '::after').content)
          .find(c => c.includes('GPU')) ?? '';
      return { banner, status, badge, note };
    }, k.path.split('/').pop());
    for (const [where, text] of Object.entries(said)) {
      if (!text.includes(place))
        seen.disagreements.push({ path: k.path, place, where, text });
    }
  }
  step('// A GPU cell run in the notebook in front');
  // A GPU cell run in the notebook in front waits in its kernel, saying its place
  await page.evaluate(
    () => void window.jupyterapp.commands.execute('notebook:run-cell')
  ); // (it waits: not awaited)
  await page.waitForTimeout(3000);
  seen.waiting_cell_says = await page.evaluate(
    () =>
      document.querySelector(
        '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output'
      )?.textContent ?? ''
  );
  step('// Three reloads');
  // Three reloads: no kernel more, none less
  const before = (await kernels(page)).map(k => k.kernel_id).sort();
  for (let i = 0; i < 3; i++) {
    await page.reload();
    await page.waitForFunction(
      () => window.jupyterapp?.commands.hasCommand('gpushare:open-panel'),
      null,
      { timeout: 120000 }
    );
    await page.waitForTimeout(1500);
  }
  const after = (await kernels(page)).map(k => k.kernel_id).sort();
  seen.same_kernels_after_reloads =
    JSON.stringify(before) === JSON.stringify(after);
  seen.sessions = (await api(page, '/api/sessions')).length;
  step('// 200% zoom');
  // 200% zoom: nothing spills or scrolls sideways in the sidebar
  await page.setViewportSize({ width: 640, height: 430 });
  await run(page, 'gpushare:open-panel');
  await page.waitForTimeout(1000);
  seen.spills_at_200 = await page.locator('#jp-gpushare').evaluate(root => {
    const out = [];
    if (root.scrollWidth > root.clientWidth + 1)
      out.push(`panel ${root.scrollWidth} > ${root.clientWidth}`);
    root.querySelectorAll('button').forEach(b => {
      if (b.offsetParent && b.scrollWidth > b.clientWidth + 1)
        out.push(`button ${b.textContent}`);
    });
    return out;
  });
  await page.setViewportSize({ width: 1280, height: 860 });
  step('// Admission in order');
  // Admission in order: the running notebooks close one by one; who is granted, and when the page shows it
  const line = (await kernels(page))
    .filter(k => k.state === 'queued')
    .sort((a, b) => a.position - b.position);
  seen.line_order = line.map(k => k.path);
  const sessions = await api(page, '/api/sessions');
  const holders = (await kernels(page)).filter(
    k => k.state !== 'queued' && k.state !== 'cpu'
  );
  seen.admitted_order = [];
  for (const h of holders) {
    const s = sessions.find(s => s.kernel.id === h.kernel_id);
    await api(page, `/api/sessions/${s.id}`, { method: 'DELETE' });
    for (let i = 0; i < 100; i++) {
      const now = await kernels(page);
      const newly = now.filter(
        k =>
          line.some(l => l.kernel_id === k.kernel_id) &&
          k.state !== 'queued' &&
          !seen.admitted_order.includes(k.path)
      );
      if (newly.length) {
        seen.admitted_order.push(...newly.map(k => k.path));
        break;
      }
      await page.waitForTimeout(100);
    }
  }
  seen.admitted_in_order =
    JSON.stringify(seen.admitted_order) ===
    JSON.stringify(seen.line_order.slice(0, seen.admitted_order.length));
  await page.screenshot({ path: path.join(out, 'class-walk.png') });
  await browser.close();
  console.log(JSON.stringify(seen));
}

main().catch(e => {
  console.error(e);
  process.exit(2);
});
