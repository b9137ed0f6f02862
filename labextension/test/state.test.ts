import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  classifyEvent,
  eventText,
  historyText,
  matchKernel,
  quotaMiB,
  statusOf,
  statusText,
  statusTitle
} from '../src/state';
import type { IKernel } from '../src/types';

function kernel(over: Partial<IKernel> = {}): IKernel {
  return {
    kernel_id: 'k-1',
    kernel_name: 'python3',
    language: 'python',
    user: 'student',
    state: 'running',
    path: 'week3/train.ipynb',
    quota: '1 GiB',
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

test('status bar: use against the reservation, the judgment the server made', () => {
  assert.equal(statusText(kernel()), 'GPU 1.4 / 1.5 GiB'); // not "/ 1.0 GiB": one definition
  assert.equal(
    statusText(kernel({ state: 'queued', position: 2 })),
    'GPU queued #2'
  );
  assert.equal(statusText(kernel({ state: 'failed' })), 'GPU: not running');
  assert.equal(statusText(kernel({ state: 'none' })), 'GPU: no quota');
  assert.equal(statusText(undefined, { hasKernel: true }), 'GPU –');
  assert.equal(statusText(undefined, { backend: 'none' }), 'no GPU');
  const title = statusTitle(kernel());
  assert.ok(
    title.startsWith('train.ipynb: near quota on GPU 0. Uses 1.4 GiB'),
    title
  );
  assert.equal(
    statusOf(kernel({ status: undefined, state: 'odd', reason: 'why' })).detail,
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

test('notifications: the notebook, what to do first, then what happened', () => {
  assert.equal(classifyEvent('admitted'), 'success');
  assert.equal(classifyEvent('refused'), 'error');
  assert.equal(classifyEvent('reserved'), null);
  assert.equal(classifyEvent('cancelled'), 'info');
  assert.equal(
    eventText(
      {
        time: 1,
        kind: 'admitted',
        message: 'Admitted after waiting 12 s.',
        advice: 'Run your cells.'
      },
      'nb3.ipynb'
    ),
    'nb3.ipynb: GPU ready. Run your cells. Admitted after waiting 12 s.'
  );
  assert.equal(
    eventText(
      {
        time: 1,
        kind: 'refused',
        message: 'No GPU has room.',
        advice: 'Ask for a smaller quota.'
      },
      'nb3.ipynb'
    ),
    'nb3.ipynb was not started. Ask for a smaller quota. No GPU has room.'
  );
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
