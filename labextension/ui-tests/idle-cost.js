// The page's idle cost with notebooks waiting (issue 47, item 7): one JupyterLab, N notebooks open in one page,
// their kernels started (with the extension, on a full card: all but the first wait in line), the sidebar closed,
// nothing touched. Counts the page's requests to the server and the CPU seconds of the browser and of the server
// over WINDOW_S. Prints one JSON object; run by bench/ui_idle_cost.sh, once with the extension and once without.
//
//   node idle-cost.js URL CHROMIUM SERVER_PID
const { chromium } = require('playwright-core');
const fs = require('fs');

const N = 9;
const WINDOW_S = Number(process.env.WINDOW_S || 60);
const TICK = 100; // clock ticks a second (Linux's USER_HZ)

const { api, putNotebook } = require('./page-api');

/** CPU seconds (user + system) of a process and all its descendants (``below``: without the process's own). */
function cpuSeconds(root, below = false) {
  const children = {};
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      (children[fields[1]] ||= []).push({
        pid: name,
        ticks: +fields[11] + +fields[12]
      });
    } catch (e) {
      // gone meanwhile
    }
  }
  let ticks = 0;
  const own = fs.readFileSync(`/proc/${root}/stat`, 'utf8');
  const f = own.slice(own.lastIndexOf(')') + 2).split(' ');
  ticks += below ? 0 : +f[11] + +f[12];
  const walk = pid => {
    for (const c of children[pid] || []) {
      ticks += c.ticks;
      walk(c.pid);
    }
  };
  walk(String(root));
  return ticks / TICK;
}

async function main() {
  const [url, executablePath, serverPid] = process.argv.slice(2);
  const browser = await chromium.launch({
    executablePath,
    args: ['--no-sandbox', '--disable-gpu']
  });
  const page = await browser.newPage({
    viewport: { width: 1280, height: 860 }
  });
  await page.goto(`${url}/lab?reset`);
  await page.waitForFunction(
    () => window.jupyterapp?.started !== undefined,
    null,
    { timeout: 120000 }
  );
  await page.waitForSelector('.jp-LauncherCard', { timeout: 120000 });
  await api(page, '/api/contents/idle', {
    method: 'PUT',
    body: JSON.stringify({ type: 'directory' })
  });
  for (let i = 1; i <= N; i++) {
    await putNotebook(page, `idle/nb${i}.ipynb`, ['1 + 1']);
  }
  for (let i = 1; i <= N; i++) {
    await page.evaluate(
      p =>
        window.jupyterapp.commands.execute('docmanager:open', {
          path: p,
          factory: 'Notebook'
        }),
      `idle/nb${i}.ipynb`
    );
  }
  for (let i = 0; i < 240; i++) {
    const ks = await api(page, '/api/kernels');
    if (ks.length === N) break;
    await page.waitForTimeout(500);
  }
  const state = await page.evaluate(async () => {
    const r = await fetch('/api/gpushare/state');
    return r.ok ? (await r.json()).kernels.map(k => k.state) : null;
  });
  if (await page.locator('#jp-gpushare').isVisible()) {
    await page.evaluate(() =>
      window.jupyterapp.commands.execute('application:toggle-right-area')
    );
  }
  await page.waitForTimeout(15000); // settled: the kernels started, the page's first reads done
  const requests = [];
  page.on('request', r => requests.push(new URL(r.url()).pathname));
  // the browser: every process this one started (Chromium and its renderers), not this script's own
  const before = {
    browser: cpuSeconds(process.pid, true),
    server: cpuSeconds(serverPid)
  };
  await page.waitForTimeout(WINDOW_S * 1000);
  const after = {
    browser: cpuSeconds(process.pid, true),
    server: cpuSeconds(serverPid)
  };
  const per = {};
  for (const p of requests) {
    const key = p.replace(/[0-9a-f-]{36}/g, '{id}');
    per[key] = (per[key] || 0) + 1;
  }
  console.log(
    JSON.stringify({
      notebooks: N,
      kernel_states: state,
      window_s: WINDOW_S,
      requests_per_min: (requests.length * 60) / WINDOW_S,
      by_path: per,
      browser_core_pct: (100 * (after.browser - before.browser)) / WINDOW_S,
      server_core_pct: (100 * (after.server - before.server)) / WINDOW_S
    })
  );
  await browser.close();
}

main().catch(e => {
  console.error(e);
  process.exit(1);
});
