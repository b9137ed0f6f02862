import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  eventText,
  historyText,
  kernelNote,
  matchKernel,
  quotaMiB,
  statusOf,
  statusText,
  setKernelNote,
  statusTitle
} from '../src/state';
import type { IEvent, IKernel } from '../src/types';
import { pseudoLocale, setTranslator } from '../src/words';

function kernel(over: Partial<IKernel> = {}): IKernel {
  return {
    kernel_id: 'k-1',
    kernel_name: 'python3',
    language: 'python',
    user: 'student',
    state: 'running',
    path: 'week3/train.ipynb',
    requested_quota_mib: 1024,
    quota_mib: 1024,
    reserve_mib: 512,
    reserved_mib: 1536,
    card: {
      index: 0,
      label: 'GPU 0',
      uuid: 'GPU-a',
      name: 'H100',
      total_mib: 81920,
      simulated: false
    },
    used_mib: 1434,
    status: {
      code: 'near_quota',
      params: {
        used_mib: 1434,
        reserved_mib: 1536,
        quota_mib: 1024,
        reserve_mib: 512,
        share_pct: 93
      },
      label: 'near quota',
      severity: 'warn',
      detail: 'Uses 1.4 GiB of its 1.5 GiB reservation (93%).'
    },
    ...over
  };
}

test('quotaMiB: the framework cap, else the reservation less the context reserve', () => {
  assert.equal(quotaMiB(kernel()), 1024);
  assert.equal(quotaMiB(kernel({ quota_mib: null })), 1024);
  assert.equal(quotaMiB(kernel({ quota_mib: null, reserved_mib: null })), null);
});

// the line's timeout, said as a time of day on this browser's clock (not as "about N min", which read as an estimate)
const GIVES_UP = 1795700000;
// 24-hour HH:MM, as the kernel says it in the cell, whatever the browser's locale
const at = new Date(GIVES_UP * 1000);
const clock = [at.getHours(), at.getMinutes()]
  .map(n => String(n).padStart(2, '0'))
  .join(':');

test('status bar: use against the reservation, the judgment the server made', () => {
  assert.equal(statusText(kernel()), 'GPU 1.4 / 1.5 GiB'); // not "/ 1.0 GiB": one definition
  const queued = kernel({
    state: 'queued',
    status: {
      code: 'queued',
      params: { position: 2, need_mib: 4710, gives_up_at: GIVES_UP },
      severity: 'warn',
      label: '',
      detail: ''
    }
  });
  // one wait, one wording: the status bar's label is the panel's badge, its tooltip the banner's sentence
  assert.equal(statusText(queued), 'GPU #2 in line');
  assert.equal(statusOf(queued).label, '#2 in line');
  assert.equal(
    statusOf(queued).detail,
    `Waiting for a GPU: #2 in line, needs 4.6 GiB; gives up at ${clock}. CPU cells run now; a cell that uses the GPU waits for it and goes on by itself when a kernel frees room.`
  );
  assert.equal(statusText(kernel({ state: 'none' })), 'no GPU');
  assert.equal(statusText(undefined, { hasKernel: true }), 'GPU –');
  assert.equal(statusText(undefined, { backend: 'none' }), 'no GPU');
  const title = statusTitle(kernel());
  assert.ok(
    title.startsWith(
      'train.ipynb: near quota on GPU 0. Uses 1.4 GiB of its 1.5 GiB reservation (quota 1 GiB + 512 MiB for the CUDA context) (93%)'
    ),
    title
  );
  assert.equal(
    statusOf(kernel({ status: undefined, state: 'failed', reason: 'why' }))
      .detail,
    'why'
  );
});

test('a notebook finds its kernel by id, never by name', () => {
  const running = kernel({
    kernel_id: 'old',
    path: 'a.ipynb',
    state: 'running'
  });
  const waiting = kernel({
    kernel_id: 'q',
    path: 'week2/a.ipynb',
    state: 'queued'
  });
  const kernels = [running, waiting];
  assert.equal(matchKernel(kernels, 'old'), running);
  assert.equal(matchKernel(kernels, 'q'), waiting);
  assert.equal(matchKernel(kernels, 'unknown'), undefined);
  // a notebook without a kernel finds none, whatever other notebooks of its name wait for
  assert.equal(matchKernel(kernels, null), undefined);
});

test('notifications: the notebook, then what happened, worded from the code', () => {
  const event = (over: Partial<IEvent>): IEvent => ({
    time: 1,
    kind: 'admitted',
    code: 'admitted',
    params: {},
    severity: 'success',
    message: 'Admitted after waiting 12 s.',
    ...over
  });
  assert.equal(
    eventText(event({ params: { waited_s: 12 } }), 'nb3.ipynb'),
    'nb3.ipynb: GPU ready after waiting 12 s.'
  );
  // a code the sidebar does not know yet: the server's English
  assert.equal(
    eventText(event({ code: 'new-kind', kind: 'new-kind' }), null),
    'A kernel: Admitted after waiting 12 s.'
  );
  assert.equal(
    eventText(
      event({ code: 'refused', params: { reason: 'No GPU has room.' } }),
      'nb3.ipynb'
    ),
    'nb3.ipynb: Not started: No GPU has room.'
  );
});

test('a figure is said as it is, never read as a template', () => {
  const k = kernel({
    path: '{detail} [{card}].ipynb',
    status: {
      code: 'cpu',
      params: { reason: 'because {position}' },
      severity: 'error',
      label: '',
      detail: ''
    }
  });
  assert.equal(statusOf(k).detail, 'Started without a GPU. because {position}');
  assert.ok(
    statusTitle(k).startsWith('{detail} [{card}].ipynb: no GPU on GPU 0.'),
    statusTitle(k)
  );
});

test('pseudo-locale: everything said is marked, figures included', () => {
  setTranslator(pseudoLocale({ __: (s: string) => s }));
  try {
    const text = statusText(kernel());
    const title = statusTitle(kernel());
    const note = eventText(
      {
        time: 1,
        kind: 'queued',
        code: 'queued',
        params: { position: 1, need_mib: 4710 },
        severity: 'warning',
        message: ''
      },
      'nb.ipynb'
    );
    for (const said of [text, note, statusOf(kernel()).detail]) {
      assert.ok(said.startsWith('⟦') && said.endsWith('⟧'), said);
    }
    // the status bar's tooltip names the notebook and card (names, not words), the rest is marked
    assert.ok(title.includes('⟦near quota⟧') && title.includes('⟦Uses'), title);
  } finally {
    setTranslator(null);
  }
});

test("history: what earlier runs peaked at, in a student's words", () => {
  assert.equal(historyText(kernel()), null); // no history: nothing said
  assert.equal(
    historyText(kernel({ learned_peak_mib: 2150, learned_from: 'own' })),
    'This notebook peaked at 2.1 GiB in your earlier runs.'
  );
  const learned = historyText(
    kernel({
      learned_peak_mib: 2150,
      learned_from: 'others',
      quota_source: 'learned'
    })
  )!;
  assert.equal(
    learned,
    'This notebook peaked at 2.1 GiB when others ran it. Its quota was learned from earlier runs.'
  );
  assert.ok(!/GpuShareApp|history_|margin/.test(learned)); // no admin setting named
  assert.equal(
    historyText(kernel({ path: null, learned_peak_mib: 512 })),
    'Your earlier python3 kernels peaked at 512 MiB.'
  );
});

test("JupyterLab's own kernel status: a note while the GPU waits or is parked, none otherwise", () => {
  const waiting = kernel({
    state: 'queued',
    status: {
      code: 'queued',
      params: { position: 3, need_mib: 1536 },
      severity: 'warn',
      label: '',
      detail: ''
    }
  });
  assert.equal(kernelNote(waiting), 'waits for a GPU, #3 in line');
  assert.equal(kernelNote(kernel({ state: 'parked' })), 'GPU parked');
  for (const state of ['running', 'cpu', 'idle'] as const) {
    assert.equal(kernelNote(kernel({ state })), '');
  }
  assert.equal(kernelNote(undefined), '');

  // the note goes into a CSS string: a quote or a backslash in it cannot end the string
  const props = new Map<string, string>();
  const node = {
    dataset: {} as Record<string, string>,
    style: {
      setProperty: (k: string, v: string) => props.set(k, v),
      removeProperty: (k: string) => props.delete(k)
    }
  } as unknown as HTMLElement;
  setKernelNote(node, 'waits for "a" GPU \\ now');
  assert.equal(
    props.get('--jp-gpushare-kernel-note'),
    '" · waits for \\"a\\" GPU \\\\ now"'
  );
  assert.equal(node.dataset.gpushareNote, 'waits for "a" GPU \\ now');
  setKernelNote(node, '');
  assert.equal(props.size, 0);
  assert.equal(node.dataset.gpushareNote, undefined);
});
