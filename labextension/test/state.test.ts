import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  cardSegments,
  describeState,
  effectiveState,
  findKernel,
  quotaMiB,
  statusText,
  statusTitle
} from '../src/state';
import type { ICard, IKernel } from '../src/types';

const card: ICard = {
  index: 0,
  uuid: 'GPU-sim-0',
  name: 'Simulated GPU',
  total_mib: 10240,
  simulated: true,
  usable_mib: 9216,
  reserved_mib: 7168,
  unreserved_mib: 2048,
  kernels: 2,
  allowed: true
};

function kernel(over: Partial<IKernel> = {}): IKernel {
  return {
    kernel_id: 'k1',
    kernel_name: 'python3',
    language: 'python',
    user: 'student',
    state: 'running',
    path: 'nb1.ipynb',
    quota: '3 GiB',
    quota_mib: 3072,
    reserve_mib: 512,
    reserved_mib: 3584,
    card,
    ...over
  };
}

test('quotaMiB: the framework cap, else reservation less context reserve', () => {
  assert.equal(quotaMiB(kernel()), 3072);
  assert.equal(quotaMiB(kernel({ quota_mib: null })), 3072);
  assert.equal(quotaMiB(kernel({ quota_mib: null, reserved_mib: null })), null);
});

test('state mapping: server states and client-side near/over quota', () => {
  assert.equal(effectiveState(kernel()), 'running');
  assert.equal(effectiveState(kernel({ used_mib: 1000 })), 'running');
  assert.equal(effectiveState(kernel({ used_mib: 2900 })), 'near_quota');
  assert.equal(effectiveState(kernel({ used_mib: 3100 })), 'over_quota');
  assert.equal(effectiveState(kernel({ used_mib: 2900 }), 0.99), 'running');
  // the server's own classification wins
  assert.equal(
    effectiveState(kernel({ state: 'idle', used_mib: 3100 })),
    'idle'
  );
  assert.equal(effectiveState(kernel({ state: 'over_quota' })), 'over_quota');

  const q = describeState(
    kernel({
      state: 'queued',
      position: 2,
      need_mib: 3584,
      free_mib: 2048,
      card: null
    })
  );
  assert.equal(q.label, 'queued #2');
  assert.equal(q.severity, 'warn');
  assert.match(q.detail, /position #2/);
  assert.match(q.detail, /needs 3\.5 GiB/);

  const cpu = describeState(
    kernel({ state: 'cpu', reason: 'No GPU: NVML not found.' })
  );
  assert.equal(cpu.label, 'cpu');
  assert.match(cpu.detail, /NVML not found/);
  assert.equal(describeState(kernel({ state: 'none' })).severity, 'muted');
  assert.equal(
    describeState(kernel({ state: 'over_quota', used_mib: 4000 })).severity,
    'error'
  );
  assert.equal(
    describeState(kernel({ state: 'something-new' })).label,
    'something-new'
  );
});

test('status bar text', () => {
  assert.equal(
    statusText(kernel({ used_mib: 1229, quota_mib: 4096 })),
    'GPU 1.2 / 4.0 GiB'
  );
  assert.equal(statusText(kernel({ quota_mib: 4096 })), 'GPU – / 4.0 GiB');
  assert.equal(
    statusText(kernel({ state: 'queued', position: 2 })),
    'GPU queued #2'
  );
  assert.equal(statusText(kernel({ state: 'cpu' })), 'no GPU');
  assert.equal(statusText(undefined, { backend: 'none' }), 'no GPU');
  assert.equal(statusText(kernel(), { backend: 'none' }), 'no GPU');
  assert.equal(statusText(undefined, { hasKernel: false }), 'GPU: no kernel');
  assert.equal(statusText(kernel({ state: 'starting' })), 'GPU starting…');
});

test('card segments sum to the card and split mine / others / free', () => {
  const mine = [kernel()];
  const segs = cardSegments(card, mine);
  const by = Object.fromEntries(segs.map(s => [s.key, s.mib]));
  assert.equal(by.mine, 3584);
  assert.equal(by.others, 7168 - 3584);
  assert.equal(by.unused, 0);
  assert.equal(by.headroom, 1024);
  assert.equal(by.free, 10240 - 7168 - 1024);
  assert.equal(
    segs.reduce((s, x) => s + x.mib, 0),
    card.total_mib
  );

  const measured = {
    ...card,
    used_by_kernels_mib: 1000,
    used_by_others_mib: 5000
  };
  const m = Object.fromEntries(
    cardSegments(measured, mine).map(s => [s.key, s.mib])
  );
  assert.equal(m.mine, 1000);
  assert.equal(m.unused, 2584);
  assert.equal(m.others, 5000); // an older server: measured use above others' reservations
  assert.equal(
    cardSegments(measured, mine).reduce((s, x) => s + x.mib, 0),
    card.total_mib
  );

  // outside_mib measured: other kernels' reservations, then what no reservation covers (a script)
  const split = cardSegments({ ...measured, outside_mib: 1000 }, mine);
  const o = Object.fromEntries(split.map(s => [s.key, s.mib]));
  assert.equal(o.others, 7168 - 3584);
  assert.equal(o.outside, 1000);
  assert.match(
    split.find(s => s.key === 'outside')!.detail!,
    /hold no reservation .* count it as taken/
  );
  assert.equal(
    split.reduce((s, x) => s + x.mib, 0),
    card.total_mib
  );

  // kernels on another card do not count
  const other = kernel({ card: { ...card, uuid: 'GPU-other' } });
  assert.equal(cardSegments(card, [other]).find(s => s.key === 'mine')!.mib, 0);
});

test('findKernel: by id, else a queued kernel by notebook path (absolute on the server)', () => {
  const ks = [
    kernel({ kernel_id: 'a', path: '/srv/root/nb1.ipynb' }),
    kernel({ kernel_id: 'b', path: '/srv/root/sub/nb3.ipynb', state: 'queued' })
  ];
  assert.equal(findKernel(ks, 'a', 'nb1.ipynb')?.kernel_id, 'a');
  assert.equal(findKernel(ks, null, 'sub/nb3.ipynb')?.kernel_id, 'b');
  assert.equal(findKernel(ks, null, 'nb3.ipynb')?.kernel_id, 'b');
  assert.equal(findKernel(ks, null, 'other.ipynb'), undefined);
  // a notebook whose new kernel id is not yet listed does not borrow a running kernel by path
  assert.equal(findKernel(ks, 'zzz', 'nb1.ipynb'), undefined);
});

test('statusTitle names the card: "GPU 0", or the MIG instance', () => {
  assert.match(statusTitle(kernel()), /quota 3 GiB on GPU 0, usage /);
  const mig = { ...card, uuid: 'MIG-x', label: 'GPU 0 MIG 3', mig_instance: 3 };
  assert.match(
    statusTitle(kernel({ card: mig })),
    /quota 3 GiB on GPU 0 MIG 3, usage /
  );
});
