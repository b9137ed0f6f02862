// Notebook 7, issue 47's round 4 (run by tests/ui/test_notebook7.py), on a card that two notebooks fill:
// - a held cell's outcome reaches the page after a reload: a notebook in line runs its GPU cell, the student
//   reloads while it waits, then the card has room; the new page shows what the cell printed and its number;
// - a wait that ends says why in one line in the cell: another notebook's GPU cell waits, its wait is stopped, and
//   the cell shows the reason alone, without the frames of the extension's own code;
// - push, not polls: a waiting notebook's page left alone asks the server for nothing of ours.
// Prints one JSON line; exits non-zero on failure.
const { kernelAt, launch, until } = require('./notebook7-lib');

const HELD = "import torch\nprint('ran after the wait')";

function notebook(source) {
  return {
    cells: [
      {
        cell_type: 'code',
        source,
        metadata: {},
        outputs: [],
        execution_count: null
      }
    ],
    metadata: {
      kernelspec: {
        name: 'python3',
        display_name: 'Python 3',
        language: 'python'
      }
    },
    nbformat: 4,
    nbformat_minor: 5
  };
}

async function main() {
  const [url, executablePath] = process.argv.slice(2);
  const base = new URL(url).origin;
  const { browser, errors, newPage } = await launch(executablePath);
  const page = await newPage();
  const api = page.request;
  const kernelOf = path => kernelAt(api, base, path);
  const openAt = async (p, path) => {
    await p.goto(`${base}/notebooks/${path}`);
    await p.waitForFunction(
      () =>
        !!window.jupyterapp &&
        window.jupyterapp.commands.hasCommand('gpushare:open-panel'),
      null,
      { timeout: 60000 }
    );
    return p.locator('.jp-NotebookPanel .jp-CodeCell').first();
  };
  const runFirstCell = async (p, cell) => {
    await cell.locator('.jp-InputArea-editor').click();
    await p.evaluate(() => {
      void window.jupyterapp.commands.execute('notebook:run-cell'); // (it ends when the cell does)
    });
  };

  for (const [path, source] of [
    ['f1.ipynb', 'x = 1'],
    ['f2.ipynb', 'x = 2'],
    ['held.ipynb', HELD],
    ['ends.ipynb', 'import torch']
  ]) {
    await api.put(`${base}/api/contents/${path}`, {
      data: { type: 'notebook', format: 'json', content: notebook(source) }
    });
  }
  const fillers = [];
  for (const path of ['f1.ipynb', 'f2.ipynb']) {
    const r = await api.post(`${base}/api/sessions`, {
      data: { path, type: 'notebook', name: path, kernel: { name: 'python3' } }
    });
    fillers.push((await r.json()).id);
  }

  // 1. The held cell, and a reload while it waits
  let cell = await openAt(page, 'held.ipynb');
  await until(
    'held.ipynb in line',
    async () => (await kernelOf('held.ipynb'))?.state === 'queued'
  );
  await runFirstCell(page, cell);
  await until(
    'the server to say which cell waits',
    async () => (await kernelOf('held.ipynb'))?.held_cell
  );
  await page.reload();
  cell = await openAt(page, 'held.ipynb');
  const prompt = cell.locator('.jp-InputPrompt');
  const waitingPrompt = await until('[*] on the reloaded page', async () => {
    const text = (await prompt.textContent()) || '';
    return text.includes('*') && text;
  });
  await api.delete(`${base}/api/sessions/${fillers[0]}`);
  const output = cell.locator('.jp-OutputArea');
  const heldOutput = await until('the held cell output', async () => {
    const text = (await output.textContent()) || '';
    return text.includes('ran after the wait') && text;
  });
  const endedPrompt = await until('the cell to end', async () => {
    const text = (await prompt.textContent()) || '';
    return !text.includes('*') && /\d/.test(text) && text;
  });

  // 2. A wait that ends: another notebook's GPU cell waits (the card is full again), and its wait is stopped
  const other = await newPage();
  const waiting = await openAt(other, 'ends.ipynb');
  const rec = await until('ends.ipynb in line', async () => {
    const k = await kernelOf('ends.ipynb');
    return k?.state === 'queued' && k;
  });
  await runFirstCell(other, waiting);
  await until(
    'the server to say which cell waits',
    async () => (await kernelOf('ends.ipynb'))?.held_cell,
    180000 // (the kernel imports PyTorch before its cell waits: over 60 s on a loaded 2-core CI machine)
  );
  await api.delete(`${base}/api/gpushare/kernels/${rec.kernel_id}`); // stop waiting
  const error = waiting.locator(
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
  );
  const ended = await until('the reason in the cell', async () => {
    const texts = await error.allTextContents();
    return texts.some(t => t.includes('GpuWaitEnded')) && texts;
  });

  // 3. Push, not polls: the page of a notebook that waits, left alone for 30 s, asks the server for nothing of ours
  // (a waiting kernel's changes come on the event bus; the page asked every 3 s)
  const idle = await newPage();
  await api.put(`${base}/api/contents/idle.ipynb`, {
    data: { type: 'notebook', format: 'json', content: notebook('x = 3') }
  });
  await openAt(idle, 'idle.ipynb');
  await until(
    'idle.ipynb in line',
    async () => (await kernelOf('idle.ipynb'))?.state === 'queued'
  );
  await idle.waitForTimeout(3000);
  const asked = [];
  idle.on('request', r => {
    if (r.url().includes('/api/gpushare/')) {
      asked.push(r.url());
    }
  });
  await idle.waitForTimeout(30000);
  await browser.close();
  console.log(
    JSON.stringify({
      errors,
      held: {
        waiting_prompt: waitingPrompt,
        output: heldOutput,
        prompt: endedPrompt
      },
      ended: ended.filter(t => t.includes('GpuWaitEnded')),
      idle_requests: asked
    })
  );
  process.exit(errors.length ? 1 : 0);
}

main().catch(e => {
  console.error(e);
  process.exit(2);
});
