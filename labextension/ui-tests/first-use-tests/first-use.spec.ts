import { expect, test } from '@playwright/test';

import { keepPageText, notebook, waitForLab } from '../notebooks';

// line_place = 'first-use' (playwright-first-use.config.js), on the 10 GiB simulated card where two 3.5 GiB
// reservations fit: a notebook holds no GPU until its first GPU import. Its card in the sidebar and the status
// bar say so, with no banner; its CPU cells run; when the card is full its `import torch` cell waits, the banner
// then says its place, and the cell goes on in the same kernel when another notebook's kernel goes.

const SOURCE = [
  ['import os\n', 'kept = 41\n', 'os.getpid()'],
  ['import torch\n', 'kept + 1, os.environ["GPUSHARE_QUOTA_MIB"], os.getpid()']
];

test.afterEach(async ({ page }, testInfo) => keepPageText(page, testInfo));

test('a notebook asks for its GPU at its first GPU import', async ({
  page,
  request
}) => {
  const content = notebook(SOURCE[0]);
  content.cells.push({ ...content.cells[0], id: 'c2', source: SOURCE[1] });
  await request.put('/api/contents/first.ipynb', {
    data: { type: 'notebook', format: 'json', content }
  });
  await page.goto('/lab');
  await waitForLab(page);
  await page.evaluate(() => {
    const app = (window as any).jupyterapp;
    app.shell.activateById('jp-gpushare');
    return app.commands.execute('docmanager:open', {
      path: 'first.ipynb',
      factory: 'Notebook'
    });
  });
  const nb = page.locator('.jp-NotebookPanel:not(.lm-mod-hidden)');
  await expect(nb.locator('.jp-Cell')).toHaveCount(2);
  await page.waitForFunction(() => {
    const w = (window as any).jupyterapp.shell.currentWidget;
    return w?.sessionContext?.session?.kernel?.status === 'idle';
  });
  const card = page.locator(
    '#jp-gpushare .jp-gpushare-kernel[data-state="standby"]'
  );
  await expect(card.locator('.jp-gpushare-badge')).toHaveText(
    'GPU at first use'
  );
  await expect(card.locator('.jp-gpushare-kernel-detail')).toContainText(
    'Holds no GPU now: its next cell that uses the GPU asks for one (a 3 GiB quota)'
  );
  await expect(card.locator('.jp-gpushare-quota')).toHaveCount(0); // nothing reserved: no bar
  await expect(page.locator('.jp-gpushare-status')).toHaveText(
    'GPU at first use'
  );
  await expect(nb.locator('.jp-gpushare-banner')).toBeHidden();

  // Its CPU cell runs.
  await nb.locator('.jp-Cell').first().click();
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('notebook:run-cell')
  );
  const firstOut = nb
    .locator('.jp-Cell')
    .first()
    .locator('.jp-OutputArea-output');
  await expect(firstOut).toHaveText(/^\d+$/, { timeout: 30000 });
  const pid = (await firstOut.textContent())!.trim();

  // A quota changed now restarts nothing: the kernel holds no GPU yet (the same process runs on).
  const dialog = page.locator('.jp-Dialog');
  await card
    .getByRole('button', {
      name: 'Change the GPU quota of first.ipynb (its first GPU use asks for it)'
    })
    .click();
  await expect(dialog).toContainText('Nothing restarts');
  await dialog.locator('input.jp-gpushare-quota-input').fill('4GiB');
  await dialog.locator('button', { hasText: 'Set quota' }).click();
  await expect(card.locator('.jp-gpushare-kernel-meta')).toContainText('4 GiB');
  await expect(card).toHaveAttribute('data-state', 'standby');

  // Two other kernels take the card: each asks at its import.
  const others: string[] = await page.evaluate(async () => {
    const app = (window as any).jupyterapp;
    const ids = [];
    for (let i = 0; i < 2; i++) {
      const k = await app.serviceManager.kernels.startNew({ name: 'python3' });
      await k.requestExecute({ code: 'import torch' }).done;
      ids.push(k.id);
    }
    return ids;
  });
  await expect(
    page.locator('#jp-gpushare .jp-gpushare-kernel[data-state="running"]')
  ).toHaveCount(2, { timeout: 30000 });

  // This notebook's first GPU cell waits in line, and says so in the cell and the banner.
  await nb.locator('.jp-Cell').nth(1).click();
  void page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('notebook:run-cell')
  ); // (its promise waits for the cell: not awaited)
  const second = nb.locator('.jp-Cell').nth(1);
  await expect(second.locator('.jp-OutputArea-output')).toContainText(
    "PyTorch waits for this kernel's GPU: #1 in line, needs 4.5 GiB",
    { timeout: 60000 }
  );
  await expect(nb.locator('.jp-gpushare-banner')).toContainText('#1 in line');
  await expect(
    page.locator(
      '#jp-gpushare .jp-gpushare-kernel[data-state="queued"] .jp-gpushare-badge'
    )
  ).toHaveText('#1 in line');

  // Another kernel goes: the cell goes on in the same process, with its variable.
  await page.evaluate(
    id => (window as any).jupyterapp.serviceManager.kernels.shutdown(id),
    others[0]
  );
  await expect(second.locator('.jp-OutputArea-output').last()).toHaveText(
    `(42, '4096', ${pid})`,
    { timeout: 60000 }
  );
  await expect(nb.locator('.jp-gpushare-banner')).toBeHidden();
});
