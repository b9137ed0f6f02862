import { expect, Page, test } from '@playwright/test';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

import {
  keepPageText,
  kernelConnected,
  notebook,
  panelSpills,
  reloadWithLayout,
  run,
  waitForLab
} from '../notebooks';

// A real JupyterLab (start-lab.sh): one simulated 10 GiB card, 3 GiB quotas + 512 MiB context reserve per
// kernel, so nb1 and nb2 fit (7 GiB) and nb3 waits in the queue. Kernels on the simulated card say what they
// "use" of it with gpushare_simulate, which is how the near- and over-quota states are reached here.

const REPO = path.resolve(__dirname, '..', '..', '..');
// Screenshots and figures go to the repo's docs/ and bench/results/ only when asked
// (GPUSHARE_UPDATE_DOCS=1), so an ordinary test run leaves the checkout as it was.
const OUT = process.env.GPUSHARE_UPDATE_DOCS
  ? null
  : fs.mkdtempSync(path.join(os.tmpdir(), 'gpushare-ui-out-'));
const IMG = OUT ?? path.join(REPO, 'docs', 'img');
const RESULTS = OUT ?? path.join(REPO, 'bench', 'results');
const AXE = require.resolve('axe-core/axe.min.js');

/** Start a command without waiting for it to end (running a cell of a kernel that waits ends when it has run). */
async function start(page: Page, command: string): Promise<void> {
  await page.evaluate(c => {
    void (window as any).jupyterapp.commands.execute(c);
  }, command);
}

async function openNotebook(page: Page, name: string): Promise<void> {
  await run(page, 'docmanager:open', { path: name, factory: 'Notebook' });
  await expect(
    page
      .locator(`.jp-mod-current[role="tab"], .lm-TabBar-tab.jp-mod-current`)
      .filter({ hasText: path.basename(name) })
      .first()
  ).toBeVisible();
}

/**
 * Change the theme and wait until it is applied and JupyterLab's splash screen is gone (a second change
 * while the first one's splash fades makes JupyterLab remove the splash twice: a page error of its own).
 */
async function changeTheme(page: Page, theme: string): Promise<void> {
  await run(page, 'apputils:change-theme', { theme });
  await page.waitForFunction(
    light => document.body.dataset.jpThemeLight === light,
    String(!theme.includes('Dark'))
  );
  await page.locator('#jupyterlab-splash').waitFor({ state: 'detached' });
}

/** Contrast (WCAG AA) of everything inside `selector`, by axe-core. */
async function contrastViolations(
  page: Page,
  selector: string
): Promise<string[]> {
  if (!(await page.evaluate(() => !!(window as any).axe))) {
    await page.addScriptTag({ path: AXE });
  }
  return page.evaluate(async sel => {
    const r = await (window as any).axe.run(document.querySelector(sel), {
      runOnly: ['color-contrast']
    });
    return r.violations.flatMap((v: any) =>
      v.nodes.map((n: any) => `${n.target.join(' ')}: ${n.failureSummary}`)
    );
  }, selector);
}

const panel = (page: Page) => page.locator('#jp-gpushare');
const kernelItems = (page: Page) => panel(page).locator('.jp-gpushare-kernel');
const item = (page: Page, name: string) =>
  kernelItems(page).filter({
    has: page.locator('.jp-gpushare-link', { hasText: name })
  });
const status = (page: Page) => page.locator('.jp-gpushare-status');
const frontNotebook = (page: Page) =>
  page.locator('.jp-NotebookPanel:not(.lm-mod-hidden)');
const banner = (page: Page) =>
  frontNotebook(page).locator('.jp-gpushare-banner');

async function hideToasts(page: Page) {
  const news = page
    .locator('.Toastify__toast')
    .filter({ hasText: 'official Jupyter news' });
  if (await news.count()) {
    await news.locator('button', { hasText: 'No' }).click();
  }
  await page.mouse.move(0, 0);
  return page.addStyleTag({
    content: '.Toastify { display: none !important; }'
  });
}

const figures: Record<string, unknown> = {};

test.describe.configure({ mode: 'serial' });
test.afterEach(async ({ page }, testInfo) => keepPageText(page, testInfo));

test.beforeAll(async ({ request }) => {
  const cells: Record<string, string> = {
    'nb1.ipynb': 'x = 1',
    'nb2.ipynb': 'x = 2',
    'nb3.ipynb': "import torch\nprint('ran after admission')",
    'nb4.ipynb': 'x = 4',
    'pseudo.ipynb': 'x = 5'
  };
  for (const [name, source] of Object.entries(cells)) {
    const r = await request.put(`/api/contents/${name}`, {
      data: { type: 'notebook', format: 'json', content: notebook(source) }
    });
    expect(r.ok()).toBeTruthy();
  }
  fs.mkdirSync(IMG, { recursive: true });
  fs.mkdirSync(RESULTS, { recursive: true });
});

test.afterAll(() => {
  fs.writeFileSync(
    path.join(RESULTS, 'ui-figures.json'),
    JSON.stringify(
      {
        what: 'jupyter-gpushare sidebar in Chromium: requests of an idle tab, admission-to-screen latency, render time',
        date: new Date().toISOString(),
        host: `${os.cpus().length} CPUs, load average ${os
          .loadavg()
          .map(x => x.toFixed(2))
          .join(' ')}`,
        ...figures
      },
      null,
      2
    ) + '\n'
  );
});

test('lab loads with the extension activated and no errors (browser check)', async ({
  page
}) => {
  const errors: string[] = [];
  page.on('pageerror', e => errors.push(`pageerror: ${e}`));
  page.on('console', m => {
    if (m.type() === 'error') {
      errors.push(`console: ${m.text()}`);
    }
  });
  await page.goto('/lab');
  await page.waitForSelector('#main');
  await waitForLab(page);
  for (const id of ['plugin', 'panel', 'status-bar', 'notebooks']) {
    expect(
      await page.evaluate(
        p =>
          (window as any).jupyterapp.isPluginActivated(`jupyter-gpushare:${p}`),
        id
      )
    ).toBe(true);
  }
  await expect(
    page.locator('.jp-SideBar [data-id="jp-gpushare"]')
  ).toBeVisible();
  // the panel's command is in the command palette and the View menu (the palette opened by its command: a key
  // press is lost while the page's focus is elsewhere, as on a loaded CI machine; and the whole asked again until
  // the item shows: on a loaded machine the palette opened by one ask was closed by the next, CI runs 32 and 33)
  const input = page.locator('.lm-CommandPalette-input');
  await expect(async () => {
    if (!(await input.isVisible())) {
      await page.evaluate(() =>
        (window as any).jupyterapp.commands.execute(
          'apputils:activate-command-palette'
        )
      );
    }
    await input.fill('GPU Memory', { timeout: 3000 });
    await expect(
      page.locator('.lm-CommandPalette-item', {
        hasText: 'Show GPU Memory Quotas'
      })
    ).toBeVisible({ timeout: 3000 });
  }).toPass({ timeout: 60000 });
  await page.keyboard.press('Escape');
  await page.locator('.lm-MenuBar-item', { hasText: 'View' }).click();
  await expect(
    page.locator('.lm-Menu-item', { hasText: 'Show GPU Memory Quotas' })
  ).toBeVisible();
  await page.keyboard.press('Escape');
  expect(errors).toEqual([]);
});

test('a student’s day: queued with a banner, a cell run while waiting, admission, quota limits, over quota said the same everywhere, a rename', async ({
  page
}) => {
  test.setTimeout(600 * 1000); // (its cells import JAX and PyTorch: past 300 s under CI run 44's load)
  const errors: string[] = [];
  page.on('pageerror', e => errors.push(`${e}\n${e.stack ?? ''}`));
  await page.goto('/lab?reset');
  await waitForLab(page);

  await run(page, 'gpushare:open-panel');
  await expect(panel(page).locator('.jp-gpushare-simulated')).toHaveText(
    'simulated'
  );
  await expect(panel(page)).toContainText(
    'No kernel holds or waits for GPU memory'
  );

  // Two notebooks get a GPU quota; the status bar shows use against the reservation (3 GiB + 512 MiB).
  await openNotebook(page, 'nb1.ipynb');
  await expect(item(page, 'nb1.ipynb')).toHaveAttribute(
    'data-state',
    'running'
  );
  await expect(item(page, 'nb1.ipynb')).toHaveClass(/jp-gpushare-current/);
  await expect(status(page)).toHaveText(/^GPU (–|0\.0) \/ 3\.5 GiB$/);
  await openNotebook(page, 'nb2.ipynb');
  await expect(item(page, 'nb2.ipynb')).toHaveAttribute(
    'data-state',
    'running'
  );
  await expect(item(page, 'nb1.ipynb')).not.toHaveClass(/jp-gpushare-current/);

  // The third waits: a banner in the notebook says so, with its place, need and when it gives up (a time of day).
  await openNotebook(page, 'nb3.ipynb');
  await expect(banner(page)).toBeVisible();
  await expect(banner(page)).toContainText(
    /^Waiting for a GPU: #1 in line, needs 3\.5 GiB(; [\d.]+ (MiB|GiB) unreserved now)?; gives up at \d{1,2}:\d\d( [AP]M)?\./
  );
  await expect(status(page)).toHaveText('GPU #1 in line');
  // JupyterLab's own kernel status: the kernel runs while its GPU waits (it read "Unknown" when the process
  // started only at the grant)
  await expect(page.locator('#jp-main-statusbar')).toContainText('| Idle');
  await expect(page.locator('#jp-main-statusbar')).not.toContainText('Unknown');
  // ... and says that its GPU waits: after "Python 3 (ipykernel) | Idle", and after the kernel's name in the
  // notebook's toolbar (one note each, nowhere else; the file browser closed from here on, the toolbar has room
  // for the name)
  await run(page, 'application:toggle-left-area');
  const notes = () =>
    page.evaluate(() =>
      Array.from(document.querySelectorAll('*'))
        .filter(e => (e as HTMLElement).offsetParent !== null)
        .map(e => [e, getComputedStyle(e, '::after').content] as const)
        .filter(([, c]) => c.includes('GPU'))
        .map(([e, c]) => `${e.textContent}${JSON.parse(c)}`)
    );
  await expect
    .poll(notes)
    .toEqual([
      'Python 3 (ipykernel) · waits for a GPU, #1 in line',
      'Python 3 (ipykernel) | Idle · waits for a GPU, #1 in line'
    ]);
  const queued = panel(page).locator(
    '.jp-gpushare-kernel[data-state="queued"]'
  );
  await expect(queued.locator('.jp-gpushare-badge')).toHaveText('#1 in line');
  // one wait, one wording: the banner's sentence is the panel's and the status bar's tooltip's, the
  // badge's label is the status bar's (all worded from the server's code and figures)
  const waitWords = (await banner(page)
    .locator('.jp-gpushare-banner-text')
    .textContent())!;
  await expect(queued.locator('.jp-gpushare-kernel-detail')).toHaveText(
    waitWords
  );
  expect(await status(page).getAttribute('title')).toContain(waitWords);
  expect(await status(page).getAttribute('aria-label')).toContain(waitWords);
  await expect(queued).toHaveClass(/jp-gpushare-current/);
  await expect(panel(page)).toContainText(
    '1 kernel waiting for a GPU on this host'
  );
  await expect(panel(page)).not.toContainText('GpuShareApp');
  // The card's parts add up, in one vocabulary: yours 7.0 GiB, unreserved 3.0 GiB.
  const legend = panel(page).locator('.jp-gpushare-card .jp-gpushare-legend');
  await expect(legend.locator('[data-key="mine"]')).toHaveText('yours 7 GiB');
  await expect(legend.locator('[data-key="free"]')).toHaveText(
    'unreserved 3 GiB'
  );

  // The waiting kernel is a kernel that runs: the notebook has its id, and a cell that uses the GPU waits in its
  // import for the grant (CPU cells run at once), and goes on once the kernel is admitted.
  await frontNotebook(page).locator('.jp-Cell').first().click();
  await start(page, 'notebook:run-cell');
  await expect(
    frontNotebook(page).locator('.jp-InputArea-prompt').first()
  ).toHaveText('[*]:');
  await expect(banner(page)).toContainText(
    'goes on by itself when a kernel frees room.'
  );

  // In the dark theme, the banner's Stop waiting button shows a focus ring that stands out (WCAG 1.4.11:
  // at least 3:1 against the banner), reached by the keyboard.
  await changeTheme(page, 'JupyterLab Dark');
  const stopButton = banner(page).locator('.jp-gpushare-banner-stop');
  await stopButton.focus();
  await page.keyboard.press('Shift+Tab');
  await page.keyboard.press('Tab');
  await expect(stopButton).toBeFocused();
  const ring = await stopButton.evaluate(node => {
    const rgb = (c: string) =>
      (c.match(/[\d.]+/g) ?? []).slice(0, 3).map(Number);
    const lum = ([r, g, b]: number[]) => {
      const f = (v: number) => {
        const x = v / 255;
        return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
      };
      return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const outline = getComputedStyle(node).outlineColor;
    const back = getComputedStyle(
      node.closest('.jp-gpushare-banner')!
    ).backgroundColor;
    const [a, b] = [lum(rgb(outline)), lum(rgb(back))].sort((x, y) => y - x);
    return {
      outline,
      back,
      width: getComputedStyle(node).outlineWidth,
      ratio: (a + 0.05) / (b + 0.05)
    };
  });
  expect(ring.width).not.toBe('0px');
  expect(ring.ratio, JSON.stringify(ring)).toBeGreaterThanOrEqual(3);
  await changeTheme(page, 'JupyterLab Light');

  // Screenshots (light theme): the sidebar, and the lab with the queued banner.
  const hide = await hideToasts(page);
  await panel(page).screenshot({ path: path.join(IMG, 'panel-light.png') });
  await page.screenshot({ path: path.join(IMG, 'lab-light.png') });
  await hide.evaluate(node => node.remove());
  expect(await contrastViolations(page, '#jp-gpushare')).toEqual([]);
  expect(await contrastViolations(page, '.jp-gpushare-banner')).toEqual([]);

  // "This host" (GET /host), in the same words as the card.
  const host = panel(page).locator('.jp-gpushare-host');
  await host.locator('.jp-gpushare-host-toggle').click();
  await expect(host).toHaveAttribute('data-view', 'admin');
  await expect(host.locator('.jp-gpushare-host-mine')).toHaveText(
    'yours 7 GiB'
  );
  await expect(host.locator('.jp-gpushare-host-free')).toHaveText(
    'unreserved 3 GiB'
  );
  await expect(
    host.locator(
      '.jp-gpushare-host-kernels tbody tr[data-kernelid] .jp-gpushare-table-name'
    )
  ).toHaveText(['nb1.ipynb', 'nb2.ipynb']);
  await host.locator('.jp-gpushare-host-toggle').click();

  // Change nb1's quota to 2 GiB: the kernel restarts with 2.5 GiB, and nb3 gets its GPU.
  const dialog = page.locator('.jp-Dialog');
  await item(page, 'nb1.ipynb')
    .getByRole('button', {
      name: 'Change the GPU quota of nb1.ipynb (restarts it)'
    })
    .click();
  await expect(dialog).toContainText('state will be lost');
  await dialog.locator('input.jp-gpushare-quota-input').fill('2GiB');
  await dialog.locator('button', { hasText: 'Restart with new quota' }).click();
  // Admission to screen: from the server's "admitted" event to nb3's line and the status bar saying it.
  const shown = await page.evaluate(
    () =>
      new Promise<number>(resolve => {
        const check = () => {
          const line = document.querySelector(
            '#jp-gpushare .jp-gpushare-current[data-state="running"]'
          );
          const bar = document.querySelector('.jp-gpushare-status');
          if (
            line &&
            bar &&
            /^GPU /.test(bar.textContent ?? '') &&
            !/queued/.test(bar.textContent ?? '')
          ) {
            resolve(Date.now() / 1000);
          } else {
            requestAnimationFrame(check);
          }
        };
        check();
      })
  );
  const state = await (await page.request.get('/api/gpushare/state')).json();
  const admitted = state.events
    .filter((e: any) => e.kind === 'admitted' && e.path === 'nb3.ipynb')
    .pop();
  expect(admitted).toBeTruthy();
  figures.admission_to_screen_ms = Math.round((shown - admitted.time) * 1000);
  console.log(`admission to screen: ${figures.admission_to_screen_ms} ms`);
  await expect(banner(page)).toBeHidden();
  await expect(
    page
      .locator('.Toastify__toast')
      .filter({
        hasText: /^nb3\.ipynb: GPU ready after waiting \d+ (s|min)\.$/
      })
      .first()
  ).toBeVisible();
  // The cell whose GPU import waited said its place, and went on once the kernel was admitted.
  const output = (mime: string) =>
    frontNotebook(page).locator(
      `.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.${mime}"]`
    );
  await expect(output('stdout')).toContainText('ran after admission', {
    timeout: 60000
  });
  // the wait's lines are no error: not red (stdout), and the framework by the name the sidebar gives it
  await expect(output('stdout')).toContainText(
    "PyTorch waits for this kernel's GPU"
  );
  await expect.poll(notes).toEqual([]); // the kernel status notes went with the wait

  // A quota above the maximum keeps the dialog open, with what was typed and why.
  await item(page, 'nb2.ipynb')
    .getByRole('button', { name: /Change the GPU quota of nb2\.ipynb/ })
    .click();
  await dialog.locator('input.jp-gpushare-quota-input').fill('8GiB');
  await dialog.locator('button', { hasText: 'Restart with new quota' }).click();
  // the server is the one judge of what was typed: its reason, linked to the field for screen readers
  const problem = dialog.locator('.jp-gpushare-quota-problem');
  await expect(problem).toHaveText(
    'A quota of 8 GiB is more than the largest a kernel may have here (6 GiB). Ask for at most 6 GiB.'
  );
  await expect(dialog.locator('input.jp-gpushare-quota-input')).toHaveAttribute(
    'aria-describedby',
    (await problem.getAttribute('id'))!
  );
  await expect(dialog.locator('input.jp-gpushare-quota-input')).toHaveValue(
    '8GiB'
  );
  await dialog.locator('button', { hasText: 'Cancel' }).click();
  await expect(dialog).toHaveCount(0);

  // Over quota: nb1 (2 GiB quota, 2.5 GiB reserved) says it uses 2.7 GiB. The panel, the status bar and the
  // notification all say "over quota", with the same figures.
  await openNotebook(page, 'nb1.ipynb');
  await frontNotebook(page).locator('.jp-Cell').first().click();
  await page.evaluate(() => {
    const app = (window as any).jupyterapp;
    const nb = app.shell.currentWidget;
    nb.content.activeCell.model.sharedModel.setSource(
      "import gpushare_simulate; gpushare_simulate.use('2.7GiB')"
    );
  });
  await run(page, 'notebook:run-cell');
  await expect(item(page, 'nb1.ipynb')).toHaveAttribute(
    'data-state',
    'over_quota',
    { timeout: 30000 }
  );
  await expect(
    item(page, 'nb1.ipynb').locator('.jp-gpushare-badge')
  ).toHaveText('over quota');
  await expect(status(page)).toHaveText('GPU 2.7 / 2.5 GiB');
  await expect(status(page)).toHaveAttribute('data-severity', 'error');
  const detail = await item(page, 'nb1.ipynb')
    .locator('.jp-gpushare-kernel-detail')
    .textContent();
  expect(detail).toContain('more than its 2.5 GiB reservation');
  expect(await status(page).getAttribute('title')).toContain(detail!);
  await expect(
    page
      .locator('.Toastify__toast')
      .filter({
        // (and what the policy does if it stays over, where it shares the card)
        hasText:
          /^nb1\.ipynb: Uses [\d.]+ GiB, (more than|over) its 2\.5 GiB reservation/
      })
      .first()
  ).toBeVisible();
  // the quota line stays visible on the red bar
  await expect(
    item(page, 'nb1.ipynb').locator('.jp-gpushare-marker-quota')
  ).toBeVisible();
  // and the entry says how firmly the server holds the kernel (the API's `held.level`), the details in its title
  const heldLine = item(page, 'nb1.ipynb').locator('.jp-gpushare-held');
  await expect(heldLine).toHaveText(
    /^Held to its quota by: (a watchdog|a watchdog and its own cgroup)$/
  );
  await expect(heldLine).toHaveAttribute(
    'title',
    /^How the server holds this kernel: (own cgroup(, escapable)?|process tree) · other cards (not )?closed · over quota: \w+\./
  );

  // Rename nb1 while it runs, then open a new notebook under the old name: its status is its own.
  await page.evaluate(() =>
    (window as any).jupyterapp.serviceManager.contents.rename(
      'nb1.ipynb',
      'renamed.ipynb'
    )
  );
  await expect(item(page, 'renamed.ipynb')).toHaveAttribute(
    'data-state',
    'over_quota',
    { timeout: 30000 }
  );
  await page.request.put('/api/contents/nb1.ipynb', {
    data: { type: 'notebook', format: 'json', content: notebook('x = 1') }
  });
  await openNotebook(page, 'nb1.ipynb'); // 2.5 + 3.5 + 3.5 GiB are held: it waits
  await expect(status(page)).toHaveText('GPU #1 in line');
  await expect(item(page, 'renamed.ipynb')).not.toHaveClass(
    /jp-gpushare-current/
  );
  // Stop waiting: asked first (Enter keeps waiting); the kernel stays and runs on without a GPU, said as
  // information, and the banner stays with the reason and Join again, which puts it back in line in place.
  await banner(page)
    .getByRole('button', { name: 'Stop waiting for a GPU for nb1.ipynb' })
    .click();
  await expect(dialog).toContainText('Stop waiting for a GPU?');
  await page.keyboard.press('Enter'); // the safe button has the focus
  await expect(page.locator('.jp-Dialog')).toHaveCount(0);
  await expect(status(page)).toHaveText('GPU #1 in line');
  await banner(page)
    .getByRole('button', { name: 'Stop waiting for a GPU for nb1.ipynb' })
    .click();
  await dialog.locator('button', { hasText: 'Stop waiting' }).click();
  await expect(
    page
      .locator('.Toastify__toast')
      .filter({ hasText: 'nb1.ipynb: Stopped waiting for a GPU' })
      .first()
  ).toBeVisible();
  await expect(banner(page)).toContainText('Stopped waiting for a GPU');
  await expect(banner(page)).toContainText('Join again');
  await expect(
    frontNotebook(page).locator('.jp-Toolbar-kernelName')
  ).not.toHaveText('No Kernel');
  await page.waitForTimeout(1500);
  await expect(page.locator('.jp-Dialog')).toHaveCount(0);
  await expect(banner(page)).toBeVisible(); // lasting
  // Join again: in place, without a dialog (nothing lost): the same kernel, its variables kept, back at #1
  const kernelId = () =>
    page.evaluate(
      () =>
        (window as any).jupyterapp.shell.currentWidget.sessionContext.session
          .kernel.id
    );
  const before = await kernelId();
  const inKernel = (code: string) =>
    page.evaluate(async c => {
      const kernel = (window as any).jupyterapp.shell.currentWidget
        .sessionContext.session.kernel;
      let said = '';
      const future = kernel.requestExecute({ code: c });
      future.onIOPub = (msg: any) => {
        if (msg.header.msg_type === 'stream') {
          said += msg.content.text;
        }
      };
      await future.done;
      return said;
    }, code);
  await inKernel('kept = 41');
  const joinAgain = () =>
    banner(page)
      .getByRole('button', {
        name: 'Join again: nb1.ipynb joins the line for a GPU'
      })
      .click();
  await joinAgain();
  await expect(status(page)).toHaveText('GPU #1 in line');
  await expect(banner(page)).toContainText('gives up at');
  await expect(page.locator('.jp-Dialog')).toHaveCount(0);
  expect(await kernelId()).toBe(before);
  expect(await inKernel('print(kept + 1)')).toBe('42\n');
  // A kernel that ran torch without the GPU can get one only by a restart: asked first, with why
  await banner(page)
    .getByRole('button', { name: 'Stop waiting for a GPU for nb1.ipynb' })
    .click();
  await dialog.locator('button', { hasText: 'Stop waiting' }).click();
  await expect(banner(page)).toContainText('Join again');
  await inKernel('import torch');
  await joinAgain();
  await expect(dialog).toContainText('Restart in line for a GPU?');
  await expect(dialog).toContainText(
    'PyTorch ran in this kernel without a GPU, so only a restart can give it one'
  );
  await dialog.locator('button', { hasText: 'Restart in line' }).click();
  await expect(status(page)).toHaveText('GPU #1 in line');
  await expect(banner(page)).toContainText('gives up at');
  // nb1's kernel goes (as the rest of this day had it): its session is shut down, and the notebook has no kernel
  for (const s of await (await page.request.get('/api/sessions')).json()) {
    if (s.path === 'nb1.ipynb') {
      await page.request.delete(`/api/sessions/${s.id}`);
    }
  }
  await expect(banner(page)).toBeHidden();

  // Dark theme: screenshot and contrast.
  await changeTheme(page, 'JupyterLab Dark');
  await page.waitForTimeout(500);
  const hide2 = await hideToasts(page);
  await panel(page).screenshot({ path: path.join(IMG, 'panel-dark.png') });
  await hide2.evaluate(node => node.remove());
  expect(await contrastViolations(page, '#jp-gpushare')).toEqual([]);
  expect(await contrastViolations(page, '.jp-gpushare-status')).toEqual([]);
  await changeTheme(page, 'JupyterLab Light');

  // Render time with 50 and 200 synthetic kernels in the real panel (layout included).
  for (const n of [50, 200]) {
    figures[`render_${n}_kernels`] = await page.evaluate(count => {
      const app = (window as any).jupyterapp;
      const widget = Array.from(app.shell.widgets('right')).find(
        (w: any) => w.id === 'jp-gpushare'
      ) as any;
      const base = widget.model.snapshot;
      const states = [
        'running',
        'near_quota',
        'over_quota',
        'idle',
        'queued',
        'cpu'
      ];
      const sev: Record<string, string> = {
        running: 'ok',
        near_quota: 'warn',
        over_quota: 'error',
        idle: 'warn',
        queued: 'warn',
        cpu: 'error'
      };
      const times: number[] = [];
      for (let r = 0; r < 20; r++) {
        const kernels = Array.from({ length: count }, (_, i) => {
          const state = states[i % states.length];
          return {
            kernel_id: `bench-${i}`,
            kernel_name: 'python3',
            language: 'python',
            user: 'student',
            path: `course/week${i % 10}/notebook-${i}.ipynb`,
            state,
            requested_quota_mib: 2048,
            quota_mib: 2048,
            reserve_mib: 512,
            reserved_mib: 2560,
            card: base.state.cards[0],
            position: 1,
            used_mib: (i * 37 + r * 11) % 2900,
            peak_mib: 2400,
            utilization: (i * 7 + r) % 100,
            history: Array.from({ length: 60 }, (_, t) => [
              1000 + 5 * t,
              (t * 40 + i) % 2600
            ]),
            status: {
              code: state,
              params: {
                used_mib: 1000,
                reserved_mib: 2560,
                quota_mib: 2048,
                reserve_mib: 512,
                position: 1,
                need_mib: 2560
              },
              label: state,
              severity: sev[state],
              detail: 'synthetic'
            },
            since: i
          };
        });
        times.push(
          widget.renderNow({
            snapshot: { ...base, state: { ...base.state, kernels } },
            current: { kernelId: 'bench-3', path: null, hasSession: true },
            currentKernel: kernels[3],
            settings: widget.model.settings,
            hostOpen: false
          })
        );
      }
      widget.renderNow();
      const sorted = times.slice(1).sort((a, b) => a - b);
      return {
        median_ms: sorted[Math.floor(sorted.length / 2)],
        p95_ms: sorted[Math.floor(sorted.length * 0.95)],
        first_ms: times[0]
      };
    }, n);
  }
  console.log(`render: ${JSON.stringify(figures.render_50_kernels)}`);

  // Shut nb2 down from the panel; the button says which notebook it acts on.
  await item(page, 'nb2.ipynb')
    .getByRole('button', { name: 'Shut down nb2.ipynb' })
    .click();
  await expect(dialog).toContainText('Shut down nb2.ipynb?');
  await dialog.locator('button.jp-mod-warn').click();
  await expect(item(page, 'nb2.ipynb')).toHaveCount(0);

  // Out of GPU memory (JAX's real RESOURCE_EXHAUSTED): the entry says so and offers the quota the server would
  // restart it with (1.5x its 2 GiB); one click restarts the kernel with it, and the server then says 3 GiB.
  // First the student frees what it used over its quota: else the over-quota grace (30 s, start-lab.sh) runs out
  // during JAX's import under a loaded machine, and the interrupt, then the restart, end the cell (CI run 48).
  await openNotebook(page, 'renamed.ipynb');
  await frontNotebook(page).locator('.jp-Cell').first().click();
  const renamed = item(page, 'renamed.ipynb');
  const runHere = async (source: string) => {
    await page.evaluate(source => {
      const nb = (window as any).jupyterapp.shell.currentWidget;
      nb.content.activeCell.model.sharedModel.setSource(source);
    }, source);
    await kernelConnected(page);
    await run(page, 'notebook:run-cell');
  };
  await runHere('import gpushare_simulate; gpushare_simulate.use(0)');
  await expect(renamed).toHaveAttribute('data-state', 'running', {
    timeout: 30000
  });
  await runHere(
    'import jax.numpy as jnp\njnp.zeros((2**44,), dtype=jnp.uint8).block_until_ready()'
  );
  await expect(renamed.locator('.jp-gpushare-kernel-oom')).toHaveText(
    'JAX ran out of GPU memory at quota 2 GiB: restart with 3 GiB to run it with more.',
    { timeout: 60000 }
  );
  await renamed
    .getByRole('button', {
      name: 'Restart renamed.ipynb with a 3 GiB GPU quota (it ran out of memory; asks first)'
    })
    .click();
  // It asks first, as Change quota does: the state will be lost; Enter would keep it (the safe button)
  await expect(dialog).toContainText('Restart renamed.ipynb with 3 GiB?');
  await expect(dialog).toContainText('loses its state');
  await expect(dialog.locator('button.jp-mod-reject')).toBeFocused();
  await dialog.locator('button.jp-mod-warn').click();
  await expect(renamed.locator('.jp-gpushare-kernel-oom')).toHaveCount(0, {
    timeout: 30000
  });
  // (the badge goes at the request; the restart that applies the quota follows)
  await expect
    .poll(
      async () => {
        const after = await (
          await page.request.get('/api/gpushare/state')
        ).json();
        const k = after.kernels.find((k: any) => k.path === 'renamed.ipynb');
        return [k?.quota_mib, k?.oom ?? null];
      },
      { timeout: 30000 }
    )
    .toEqual([3072, null]);
  expect(errors).toEqual([]);
});

/** This server's kernels as our API judges them, and its sessions' kernels. */
async function census(page: Page) {
  const state = await (await page.request.get('/api/gpushare/state')).json();
  const sessions = await (await page.request.get('/api/sessions')).json();
  const kernels = await (await page.request.get('/api/kernels')).json();
  const count = (s: string) =>
    state.kernels.filter((k: any) => k.state === s).length;
  return {
    queued: count('queued'),
    running: count('running'),
    kernels: kernels.length,
    sessions: sessions.length,
    withSession: new Set(sessions.map((x: any) => x.kernel?.id)),
    reserved: state.kernels
      .filter((k: any) => k.reserved_mib !== null)
      .map((k: any) => k.kernel_id) as string[]
  };
}

test('eight notebooks waiting in one page: the page stays usable, reloads add no kernel, stop waiting acts at once', async ({
  page
}) => {
  test.setTimeout(300 * 1000);
  for (const s of await (await page.request.get('/api/sessions')).json()) {
    await page.request.delete(`/api/sessions/${s.id}`);
  }
  await page.request.put('/api/contents/class', {
    data: { type: 'directory' }
  });
  const names = Array.from({ length: 10 }, (_, i) => `class/q${i + 1}.ipynb`);
  for (const name of names) {
    await page.request.put(`/api/contents/${name}`, {
      data: { type: 'notebook', format: 'json', content: notebook('x = 1') }
    });
  }
  await page.goto('/lab?reset');
  await waitForLab(page);
  for (const name of names) {
    await openNotebook(page, name);
  }
  // 3.5 GiB each on the 10 GiB card: two run, eight wait; each its own kernel, each with a session.
  await expect.poll(async () => (await census(page)).queued).toBe(8);
  expect(await census(page)).toMatchObject({
    running: 2,
    kernels: 10,
    sessions: 10
  });

  // The page stays usable: its own requests are answered (no connection is held by a waiting start), and the
  // file browser lists the folder.
  const listed = await page.evaluate(async () => {
    const t0 = performance.now();
    const r = await fetch('/api/contents/class?content=1');
    await r.json();
    return performance.now() - t0;
  });
  figures.contents_with_8_waiting_ms = Math.round(listed);
  // answered, not held behind a waiting start (that would be minutes); the time itself is a figure, not a target
  // (1.8 s seen under CI's load on 2 cores)
  expect(listed).toBeLessThan(10000);
  await run(page, 'filebrowser:go-to-path', { path: 'class' });
  await expect(page.locator('#filebrowser .jp-DirListing-item')).toHaveCount(
    10
  );

  // Three reloads: each notebook finds its own kernel again; nothing new waits.
  for (let i = 0; i < 3; i++) {
    await reloadWithLayout(page, names);
    await expect(page.locator('.jp-NotebookPanel')).toHaveCount(10);
    await expect(banner(page)).toBeVisible();
  }
  expect(await census(page)).toMatchObject({
    queued: 8,
    running: 2,
    kernels: 10,
    sessions: 10
  });

  // The class at 200% zoom (a 640 x 430 CSS-pixel window): ten cards in the sidebar, nothing scrolls sideways
  // and no button's text spills; the banner of the notebook in front keeps to three lines of its sentence.
  await page.setViewportSize({ width: 640, height: 430 });
  await run(page, 'gpushare:open-panel');
  await expect(kernelItems(page)).toHaveCount(10);
  await expect(
    kernelItems(page).filter({
      has: page.locator('.jp-gpushare-badge', { hasText: /#\d+ in line/ })
    })
  ).toHaveCount(8);
  expect(await panelSpills(page)).toEqual([]);
  const lines = await banner(page)
    .locator('.jp-gpushare-banner-text')
    .evaluate(text => {
      const style = getComputedStyle(text);
      const line =
        parseFloat(style.lineHeight) || 1.2 * parseFloat(style.fontSize);
      return text.getBoundingClientRect().height / line;
    });
  expect(lines).toBeLessThanOrEqual(3.1);
  await page.setViewportSize({ width: 1280, height: 860 });

  // Stop waiting on the notebook in front: it leaves the line at once (its kernel stays, without a GPU),
  // the others keep their places.
  const front = await page.evaluate(
    () =>
      (window as any).jupyterapp.shell.currentWidget.sessionContext.session
        .kernel.id
  );
  await banner(page)
    .getByRole('button', { name: /Stop waiting/ })
    .click();
  // At once: the server's answer to the page's request is the kernel out of line (its next state read says so), not
  // a change that comes later; its time is a figure, not a limit (CI run 49 read 1009 ms on a loaded machine)
  const t0 = Date.now();
  const stopped = page.waitForResponse(
    r =>
      r.request().method() === 'DELETE' &&
      r.url().includes(`/api/gpushare/kernels/${front}`)
  );
  await page
    .locator('.jp-Dialog')
    .locator('button', { hasText: 'Stop waiting' })
    .click();
  expect((await stopped).ok()).toBe(true);
  figures.stop_waiting_ms = Date.now() - t0;
  const stateNow = await (await page.request.get('/api/gpushare/state')).json();
  expect(stateNow.kernels.find((k: any) => k.kernel_id === front)?.state).toBe(
    'cpu'
  );
  expect(await census(page)).toMatchObject({ queued: 7, kernels: 10 });

  // Room for two more: every kernel that holds a reservation is a notebook's (has a session).
  const running = (await census(page)).reserved;
  for (const s of await (await page.request.get('/api/sessions')).json()) {
    if (running.includes(s.kernel.id)) {
      await page.request.delete(`/api/sessions/${s.id}`);
    }
  }
  await expect.poll(async () => (await census(page)).queued).toBe(5);
  const after = await census(page);
  expect(after.reserved.length).toBe(2);
  for (const id of after.reserved) {
    expect(after.withSession.has(id)).toBe(true);
  }
  for (const s of await (await page.request.get('/api/sessions')).json()) {
    await page.request.delete(`/api/sessions/${s.id}`);
  }
});

test('an idle tab with the panel closed asks the server at most twice a minute, a kernel of ours waiting', async ({
  page
}) => {
  test.setTimeout(180 * 1000);
  // idle: no notebook open (a fresh workspace), and a kernel of ours waits: its changes are pushed on the event
  // bus, so the page does not poll for them (it asked every 3 s: 20 requests a minute)
  const state = await (await page.request.get('/api/gpushare/state')).json();
  for (const k of state.kernels.filter((k: any) => k.state === 'queued')) {
    expect(
      (await page.request.delete(`/api/gpushare/kernels/${k.kernel_id}`)).ok()
    ).toBeTruthy();
  }
  const queued = async () =>
    (await (await page.request.get('/api/gpushare/state')).json()).kernels.some(
      (k: any) => k.state === 'queued'
    );
  const started: string[] = [];
  while (!(await queued()) && started.length < 4) {
    const r = await page.request.post('/api/kernels', {
      data: { name: 'python3' }
    });
    started.push((await r.json()).id);
  }
  expect(await queued()).toBe(true);
  await page.goto('/lab?reset');
  await waitForLab(page);
  // the sidebar closed
  if (await panel(page).isVisible()) {
    await run(page, 'application:toggle-right-area');
  }
  await expect(panel(page)).toBeHidden();
  await page.waitForTimeout(3000);
  const calls: string[] = [];
  page.on('request', r => {
    if (r.url().includes('/api/gpushare/')) {
      calls.push(r.url());
    }
  });
  await page.waitForTimeout(60 * 1000);
  const asked = calls.length;
  figures.idle_tab_requests_per_minute = asked;
  console.log(`idle tab: ${asked} requests in 60 s`);
  for (const id of started) {
    await page.request.delete(`/api/kernels/${id}`);
  }
  expect(asked).toBeLessThanOrEqual(2);
});

test('under a pseudo-locale every word of the panel and the status bar is translated', async ({
  page
}) => {
  // words.ts marks every string of its catalogue ⟦…⟧ in the pseudo-locale: what is left unmarked was not
  // worded through JupyterLab's translator (names of notebooks, users and cards are not words)
  await page.addInitScript(() =>
    window.localStorage.setItem('jupyter-gpushare:pseudo-locale', '1')
  );
  await page.goto('/lab?reset');
  await waitForLab(page);
  await run(page, 'gpushare:open-panel');
  await openNotebook(page, 'pseudo.ipynb');
  await expect(item(page, 'pseudo.ipynb')).toHaveAttribute(
    'data-state',
    /running|queued/
  );
  const host = panel(page).locator('.jp-gpushare-host');
  await host.locator('.jp-gpushare-host-toggle').click();
  await expect(host).toHaveAttribute('data-view', /admin|student/);
  const unmarked = await page.evaluate(() => {
    const roots = [
      document.querySelector('#jp-gpushare'),
      document.querySelector('.jp-gpushare-status')
    ];
    const left: string[] = [];
    for (const root of roots) {
      const texts: string[] = [];
      const walker = document.createTreeWalker(root!, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        texts.push(n.textContent ?? '');
      }
      const attrs = Array.from(root!.querySelectorAll('[title],[aria-label]'))
        .flatMap(e => [e.getAttribute('title'), e.getAttribute('aria-label')])
        .filter((t): t is string => !!t);
      for (const text of [...texts, ...attrs]) {
        let rest = text;
        for (let i = 0; i < 5; i++) {
          rest = rest.replace(/⟦[^⟦⟧]*⟧/g, ' '); // innermost first: words inside words
        }
        rest = rest
          .replace(/[\w.-]+\.ipynb/g, ' ') // notebook names
          .replace(
            /\b[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\b|\b[0-9a-f]{8}\b/g,
            ' '
          ) // kernel ids
          .replace(
            /GPU \d+( MIG \d+)?|Simulated GPU \(no real memory\)|python3|root|admin/g,
            ' '
          ) // card, kernel and user names
          .replace(/[\s·↻▸▾,:;()#\d.%–/+-]+/g, '');
        if (rest) {
          left.push(`${rest} (in "${text}")`);
        }
      }
    }
    return left;
  });
  expect(unmarked).toEqual([]);
});

test('empty and error states explain themselves', async ({ page }) => {
  await page.route('**/api/gpushare/**', route =>
    route.fulfill({ status: 404, body: '<html>404</html>' })
  );
  await page.goto('/lab?reset');
  await waitForLab(page);
  await run(page, 'gpushare:open-panel');
  await expect(panel(page)).toContainText('server extension is not running');
  await page.unrouteAll({ behavior: 'ignoreErrors' });

  await page.route(/\/api\/gpushare\/state(\?|$)/, route =>
    route.fulfill({
      json: {
        version: 'test',
        backend: 'none',
        simulated: false,
        cards: [],
        kernels: [],
        queue: [],
        events: [],
        config: {},
        reason: 'NVML is not installed (libnvidia-ml.so.1 not found).'
      }
    })
  );
  await page.goto('/lab?reset');
  await waitForLab(page);
  await run(page, 'gpushare:open-panel');
  await expect(panel(page)).toContainText('No GPU on this server');
  await expect(panel(page)).toContainText('libnvidia-ml.so.1 not found');
  await page.mouse.move(0, 0);
  await panel(page).screenshot({ path: path.join(IMG, 'panel-no-gpu.png') });
});

test('the host view is read only while open and shown; its 503 stays in its section', async ({
  page
}) => {
  const hostCalls: string[] = [];
  await page.route(/\/api\/gpushare\/host(\?|$)/, route => {
    hostCalls.push(route.request().url());
    return route.fulfill({
      status: 503,
      json: { message: 'The GPU broker is not reachable (test).' }
    });
  });
  await page.goto('/lab?reset');
  await waitForLab(page);
  await run(page, 'gpushare:open-panel');
  await expect(panel(page).locator('.jp-gpushare-card')).toHaveCount(1);
  await page.waitForTimeout(4000);
  expect(hostCalls).toHaveLength(0);

  const host = panel(page).locator('.jp-gpushare-host');
  await host.locator('.jp-gpushare-host-toggle').click();
  await expect(host).toContainText('The host view is unavailable');
  await expect(host).toContainText('The GPU broker is not reachable (test).');
  await expect(panel(page).locator('.jp-gpushare-card')).toHaveCount(1);
  await expect(panel(page).locator('.jp-gpushare-notice-error')).toHaveCount(1);
  await expect(panel(page)).toContainText('My kernels');
  await expect
    .poll(() => hostCalls.length, { timeout: 15000 })
    .toBeGreaterThan(2);

  await run(page, 'application:toggle-right-area');
  await expect(panel(page)).toBeHidden();
  await page.waitForTimeout(500);
  let n = hostCalls.length;
  await page.waitForTimeout(4000);
  expect(hostCalls.length).toBe(n);
  await run(page, 'gpushare:open-panel');
  await expect.poll(() => hostCalls.length).toBeGreaterThan(n);
  await host.locator('.jp-gpushare-host-toggle').click();
  await page.waitForTimeout(500);
  n = hostCalls.length;
  await page.waitForTimeout(4000);
  expect(hostCalls.length).toBe(n);
});
