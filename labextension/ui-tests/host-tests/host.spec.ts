import { expect, Page, Response, test } from '@playwright/test';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

// Run by tests/ui/test_ui.py::test_host_view_through_a_broker, which starts a broker on a simulated
// 10 GiB card (2 GiB quota + 512 MiB context reserve per kernel, at most 4 GiB of quotas per
// user) and the servers of three Unix users:
//   other   – a kernel of a notebook, and a second one waiting in the host queue;
//   student – this page's user: one kernel;
//   admin   – in the broker's admin_users: two kernels.
// The environment gives each page's URL (with its token) and what the student must never see.

const env = (name: string): string => {
  const v = process.env[name];
  if (!v) {
    throw new Error(`${name} is not set: run this from tests/ui/test_ui.py`);
  }
  return v;
};
/** A name as it reads inside a RegExp. */
const esc = (text: string): string =>
  text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

const REPO = path.resolve(__dirname, '..', '..', '..');
const IMG = process.env.GPUSHARE_UPDATE_DOCS
  ? path.join(REPO, 'docs', 'img')
  : fs.mkdtempSync(path.join(os.tmpdir(), 'gpushare-ui-out-'));

const panel = (page: Page) => page.locator('#jp-gpushare');
const host = (page: Page) => panel(page).locator('.jp-gpushare-host');

async function openLab(page: Page, url: string): Promise<void> {
  // These servers do not expose window.jupyterapp: the panel opens from its sidebar tab.
  await page.goto(url);
  await page.waitForSelector('#jupyterlab-splash', { state: 'detached' });
  // notifications (JupyterLab's news question, the kernels' own) stay out of the way of the clicks
  await page.addStyleTag({
    content: '.Toastify { display: none !important; }'
  });
  await page.locator('.jp-SideBar [data-id="jp-gpushare"]').click();
  await expect(panel(page)).toBeVisible();
}

async function openHost(page: Page): Promise<void> {
  await expect(host(page)).toHaveAttribute('data-open', 'false');
  await host(page).locator('.jp-gpushare-host-toggle').click();
  await expect(host(page).locator('.jp-gpushare-host-card')).toHaveCount(1);
}

async function screenshot(page: Page, name: string): Promise<void> {
  await page.mouse.move(0, 0);
  const hide = await page.addStyleTag({
    content: '.Toastify { display: none !important; }'
  });
  await page.setViewportSize({ width: 1280, height: 1600 });
  await host(page).screenshot({ path: path.join(IMG, name) });
  await hide.evaluate(node => node.remove());
}

test('a student sees other users only as a total per card and nameless queue places', async ({
  page
}) => {
  const secrets: string[] = JSON.parse(env('GPUSHARE_HOST_SECRETS'));
  expect(secrets.length).toBeGreaterThan(2);
  // Everything the page is sent by its server, to look for the secrets in too.
  const bodies: string[] = [];
  page.on('response', (r: Response) => {
    if (/\/api\//.test(r.url()) && r.request().method() !== 'OPTIONS') {
      r.text()
        .then(t => bodies.push(`${r.url()}\n${t}`))
        .catch(() => undefined);
    }
  });
  const errors: string[] = [];
  page.on('pageerror', e => errors.push(String(e)));

  await openLab(page, env('GPUSHARE_HOST_STUDENT_URL'));
  // The student's own kernel is in "My kernels", as before.
  await expect(panel(page).locator('.jp-gpushare-kernel')).toHaveCount(1);
  await expect(panel(page).locator('.jp-gpushare-link')).toHaveText(
    'mine.ipynb'
  );
  await openHost(page);
  const h = host(page);
  await expect(h).toHaveAttribute('data-view', 'student');
  // the others' total: other 2.5 + admin 5.0 GiB; the card is full
  await expect(h.locator('.jp-gpushare-host-others')).toHaveText(
    'other users 7.5 GiB'
  );
  await expect(h.locator('.jp-gpushare-host-mine')).toHaveText('yours 2.5 GiB');
  await expect(h.locator('.jp-gpushare-host-free')).toHaveText(
    'unreserved 0 MiB'
  );
  await expect(h.locator('.jp-gpushare-seg-others').first()).toHaveAttribute(
    'title',
    /^Other users: 7\.5 GiB/
  );
  await expect(h.locator('.jp-gpushare-host-limits')).toHaveText(
    /^Your limits: up to 4 GiB in total\. You hold 2 GiB of 4 GiB\./
  );
  await expect(h.locator('.jp-gpushare-host-private')).toContainText(
    'Other users are shown only as totals per card'
  );
  await expect(h.locator('.jp-gpushare-table')).toHaveCount(0);
  await expect(h.locator('.jp-gpushare-host-queue li')).toHaveText([
    /^#1 another user’s kernel · waiting \d+ (s|min)$/
  ]);

  // Over a few refreshes (3 s each), nothing of the other users shows up anywhere in the page:
  // not in its text, not in an attribute (tooltips, data-*), not in a reply it was sent.
  for (let i = 0; i < 3; i++) {
    const html = await page.content();
    const text = await page.evaluate(() => document.body.innerText);
    for (const s of secrets) {
      expect(html, `"${s}" in the page's HTML`).not.toContain(s);
      expect(text, `"${s}" in the page's text`).not.toContain(s);
    }
    await page.waitForTimeout(3500);
  }
  expect(bodies.some(b => b.includes('/api/gpushare/host'))).toBeTruthy();
  for (const body of bodies) {
    for (const s of secrets) {
      expect(body, `"${s}" in a reply`).not.toContain(s);
    }
  }
  await screenshot(page, 'panel-host-student.png');
  expect(errors).toEqual([]);
});

test('an admin sees every user and kernel, and whose queued kernel waits', async ({
  page
}) => {
  const users: { [name: string]: [number, string] } = JSON.parse(
    env('GPUSHARE_HOST_USERS')
  );
  const other = env('GPUSHARE_HOST_OTHER');
  await openLab(page, env('GPUSHARE_HOST_ADMIN_URL'));
  await openHost(page);
  const h = host(page);
  await expect(h).toHaveAttribute('data-view', 'admin');
  await expect(h.locator('.jp-gpushare-host-toggle')).toContainText('admin');
  const rows = h.locator('.jp-gpushare-users tbody tr[data-user]');
  await expect(rows).toHaveCount(Object.keys(users).length);
  for (const [name, [kernels, reserved]] of Object.entries(users)) {
    await expect(
      h.locator(`.jp-gpushare-users tr[data-user="${name}"] td`)
    ).toHaveText([
      new RegExp(`^${name}( \\(you\\))?$`),
      String(kernels),
      reserved
    ]);
  }
  await expect(h.locator('.jp-gpushare-table-total td')).toHaveText([
    'all',
    '4',
    '10 GiB'
  ]);
  await expect(
    h.locator('.jp-gpushare-host-kernels tbody tr[data-kernelid]')
  ).toHaveCount(4);
  // grouped by user: a group row each, then their kernels
  await expect(
    h.locator('.jp-gpushare-host-kernels .jp-gpushare-table-group')
  ).toHaveCount(3);
  await expect(
    h.locator(
      `.jp-gpushare-host-kernels tr[data-kernelid][data-user="${other}"]`
    )
  ).toHaveCount(1);
  await expect(h.locator('.jp-gpushare-host-others')).toHaveText(
    'other users 5 GiB'
  );
  await expect(
    h.locator(
      `.jp-gpushare-host-kernels tr[data-kernelid][data-user="${other}"]`
    )
  ).toContainText(env('GPUSHARE_HOST_THESIS')); // another server's notebook, as its server told the broker
  await expect(h.locator('.jp-gpushare-host-queue li')).toHaveText([
    // its need: quota + context reserve; another server's kernel, named by its notebook
    new RegExp(
      `^#1 ${other}’s ${esc(env('GPUSHARE_HOST_DRAFT'))}, 2.5 GiB · waiting`
    )
  ]);
  await screenshot(page, 'panel-host-admin.png');
});

test('an admin takes a waiting kernel out of the line, through the broker', async ({
  page
}) => {
  await openLab(page, env('GPUSHARE_HOST_ADMIN_URL'));
  const h = host(page);
  if ((await h.getAttribute('data-open')) !== 'true') {
    await h.locator('.jp-gpushare-host-toggle').click();
  }
  await expect(h).toHaveAttribute('data-view', 'admin');
  const entry = h.locator('.jp-gpushare-host-queue li').first();
  const draft = esc(env('GPUSHARE_HOST_DRAFT'));
  const whose = new RegExp(
    `^Take out: ${env('GPUSHARE_HOST_OTHER')}’s ${draft}$`
  );
  await entry.getByRole('button', { name: whose }).click();
  const dialog = page.locator('.jp-Dialog');
  await expect(dialog).toContainText(
    new RegExp(
      `Take ${env('GPUSHARE_HOST_OTHER')}’s ${draft} out of the line\\?`
    )
  );
  // Enter is safe: the focus is on Cancel, not on the action
  expect(await page.evaluate(() => document.activeElement?.textContent)).toBe(
    'Cancel'
  );
  await dialog.locator('input').fill('the lab is over for today');
  await dialog.locator('button', { hasText: 'Take out' }).click();
  await expect(dialog).toHaveCount(0);
  // the broker carried it out: nobody waits on the host now (its student's server tells them: test_ui.py)
  await expect(h.locator('.jp-gpushare-host-queue li')).toHaveCount(0);
});
