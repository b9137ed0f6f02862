import { expect, type Page, type TestInfo } from '@playwright/test';
import * as fs from 'fs';

/** A one-cell Python notebook of ``source`` (a string, or its lines), as the contents API takes it. */
export function notebook(source: string | string[]) {
  return {
    cells: [
      {
        cell_type: 'code',
        execution_count: null,
        id: 'c1',
        metadata: {},
        outputs: [],
        source: Array.isArray(source) ? source : [source]
      }
    ],
    metadata: {
      kernelspec: {
        display_name: 'Python 3 (ipykernel)',
        language: 'python',
        name: 'python3'
      },
      language_info: { name: 'python' }
    },
    nbformat: 4,
    nbformat_minor: 5
  };
}

/** The lab is up: our commands exist and the workspace is restored (the splash screen is gone). */
export async function waitForLab(page: Page): Promise<void> {
  await page.waitForFunction(() => {
    const app = (window as any).jupyterapp;
    return !!app && app.commands.hasCommand('gpushare:open-panel');
  });
  await page.waitForSelector('#jupyterlab-splash', { state: 'detached' });
}

/** Reload once the server holds the page's layout with every notebook of ``paths`` open: JupyterLab saves its
 * workspace a while after a change, and a reload before that restores fewer (CI run 45: 8 of 10 under load). */
export async function reloadWithLayout(
  page: Page,
  paths: string[]
): Promise<void> {
  const workspace = await page.evaluate(
    () =>
      JSON.parse(document.getElementById('jupyter-config-data')!.textContent!)
        .workspace as string
  );
  await expect
    .poll(
      async () => {
        const saved = await (
          await page.request.get(`/lab/api/workspaces/${workspace}`)
        ).json();
        return paths.filter(p => !(`notebook:${p}` in (saved.data ?? {})));
      },
      { timeout: 60000, message: 'notebooks not yet in the saved layout' }
    )
    .toEqual([]);
  await page.reload();
  await waitForLab(page);
}

/**
 * What spills out of the GPU panel: a sideways scroll, a button's text wider
 * than its button, or a button cut off at the panel's edge (past its visible
 * width: its scrollbar aside).
 */
export async function panelSpills(page: Page): Promise<string[]> {
  return page.locator('#jp-gpushare').evaluate(root => {
    const out: string[] = [];
    if (root.scrollWidth > root.clientWidth + 1) {
      out.push(`panel ${root.scrollWidth} > ${root.clientWidth}`);
    }
    const edge =
      root.getBoundingClientRect().left + root.clientLeft + root.clientWidth;
    root.querySelectorAll('button').forEach(b => {
      if (b.offsetParent && b.scrollWidth > b.clientWidth + 1) {
        out.push(
          `button "${b.textContent}" ${b.scrollWidth} > ${b.clientWidth}`
        );
      }
      const right = b.getBoundingClientRect().right;
      if (b.offsetParent && right > edge + 1) {
        out.push(`button "${b.textContent}" ends at ${right}, past ${edge}`);
      }
    });
    return out;
  });
}

/** The current notebook's page holds its kernel, connected: a cell run before that is cleared without running
 * (JupyterLab's CodeCell.execute with no kernel; CI stop 54, a loaded machine, the server's kernel already waiting). */
export async function kernelConnected(page: Page): Promise<void> {
  await page.waitForFunction(
    () => {
      const kernel = (window as any).jupyterapp.shell.currentWidget
        ?.sessionContext?.session?.kernel;
      return kernel?.connectionStatus === 'connected';
    },
    undefined,
    { timeout: 60000 }
  );
}

/** Run a command and wait for it to end. Its result stays in the page: a widget's reference chain is too long for
 * Playwright to bring back (CI stop 53 failed on reopening a notebook). */
export async function run(
  page: Page,
  command: string,
  args: any = {}
): Promise<void> {
  await page.evaluate(
    async ([c, a]) => {
      await (window as any).jupyterapp.commands.execute(c, a);
    },
    [command, args] as const
  );
}

/** After a test that failed, what its page showed (its text), beside its other results: the browser run's report
 * says it (tests/ui/test_ui.py), where a screenshot is out of reach. */
export async function keepPageText(
  page: Page,
  testInfo: TestInfo
): Promise<void> {
  if (testInfo.status === testInfo.expectedStatus) {
    return;
  }
  const text = await page
    .evaluate(() => document.body.innerText)
    .catch(e => `(the page's text could not be read: ${e})`);
  fs.writeFileSync(testInfo.outputPath('page.txt'), text.slice(-20000));
}
