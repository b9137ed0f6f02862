import type { Page } from '@playwright/test';

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
