import { expect, test } from '@playwright/test';

import { keepPageText, notebook, waitForLab } from '../notebooks';

// The over-quota policy interrupts a kernel 2 s over its reservation (playwright-enforce.config.js): the
// interrupted cell says why, with the figures and what to do, where the student sees the KeyboardInterrupt.

const SOURCE = [
  'import time, gpushare_simulate\n',
  "gpushare_simulate.use('3.8GiB')\n",
  'try:\n',
  '    time.sleep(120)\n',
  'finally:\n',
  "    gpushare_simulate.use('0.5GiB')"
];

test.afterEach(async ({ page }, testInfo) => keepPageText(page, testInfo));

test('an interrupted cell says why in its output', async ({
  page,
  request
}) => {
  await request.put('/api/contents/over.ipynb', {
    data: {
      type: 'notebook',
      format: 'json',
      content: notebook(SOURCE)
    }
  });
  await page.goto('/lab');
  await waitForLab(page);
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('docmanager:open', {
      path: 'over.ipynb',
      factory: 'Notebook'
    })
  );
  const nb = page.locator('.jp-NotebookPanel:not(.lm-mod-hidden)');
  await expect(nb.locator('.jp-Cell')).toHaveCount(1);
  await page.waitForFunction(() => {
    const w = (window as any).jupyterapp.shell.currentWidget;
    return w?.sessionContext?.session?.kernel?.status === 'idle';
  });
  await nb.locator('.jp-Cell').first().click();
  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('notebook:run-cell')
  );
  const said = nb
    .locator(
      '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
    )
    .filter({ hasText: 'GPU memory quota' });
  await expect(said).toHaveCount(1, { timeout: 60000 });
  await expect(said).toContainText(
    /GPU memory quota: Interrupted: it used 3\.8 GiB, over its 3\.5 GiB reservation(, for \d+ (s|min))?\. Free memory or ask for a larger quota\./,
    { timeout: 60000 }
  );
  await expect(
    nb.locator('.jp-OutputArea-output').filter({ hasText: 'KeyboardInterrupt' })
  ).toHaveCount(1); // the explanation is beside the interrupt it explains, once
});
