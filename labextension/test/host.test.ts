import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  hasLimits,
  hostKernelRows,
  limitsText,
  limitsUse,
  queueEntryText,
  queueWho,
  kernelWho,
  usersTotal
} from '../src/host';
import type {
  IHostCard,
  IHostKernel,
  IHostView,
  ILimitsUse
} from '../src/types';

const card: IHostCard = {
  index: 0,
  uuid: 'GPU-sim-0',
  name: 'Simulated GPU',
  total_mib: 10240,
  simulated: true,
  usable_mib: 9216, // 1 GiB headroom
  reserved_mib: 5120,
  unreserved_mib: 4096,
  mine_reserved_mib: 2560,
  others_reserved_mib: 2560,
  allowed: true
};

function hostKernel(over: Partial<IHostKernel> = {}): IHostKernel {
  return {
    kernel_id: '11111111-aaaa-bbbb-cccc-000000000000',
    kernel_name: 'python3',
    user: 'me',
    card_index: 0,
    card_uuid: 'GPU-sim-0',
    quota_mib: 2048,
    reserve_mib: 512,
    reserved_mib: 2560,
    server_pid: 100,
    kernel_pid: 101,
    age_s: 30,
    ...over
  };
}

function view(over: Partial<IHostView> = {}): IHostView {
  return {
    user: 'me',
    admin: false,
    limits: null,
    context_reserve_mib: 512,
    cards: [card],
    users: [{ user: 'me', kernels: 1, quota_mib: 2048, reserved_mib: 2560 }],
    kernels: [hostKernel()],
    queue: [],
    ...over
  };
}

test('limits in one phrase, only those set', () => {
  assert.equal(
    limitsText({ max_total: '16 GiB', max_kernel: '8 GiB', max_kernels: 2 }),
    'up to 16 GiB in total, 8 GiB per kernel, 2 GPU kernels'
  );
  assert.equal(limitsText({ max_total: '4 GiB' }), 'up to 4 GiB in total');
  assert.equal(
    limitsText({ max_total: null, max_kernel: '25%', max_kernels: 1 }),
    'up to 25% of a card per kernel, 1 GPU kernel'
  );
  assert.equal(
    limitsText({ max_total: null, max_kernel: null, max_kernels: null }),
    null
  );
  assert.equal(limitsText(null), null);
  assert.equal(hasLimits({ max_kernels: 0 }), true);
  assert.equal(hasLimits({}), false);
});

test("limits use: the server's figures and judgment, worded", () => {
  const use = (over: Partial<ILimitsUse> = {}): ILimitsUse => ({
    quota_mib: 2048,
    max_total_mib: 4096,
    max_kernel_mib: null,
    kernels: 1,
    max_kernels: 2,
    full: false,
    ...over
  });
  assert.deepEqual(limitsUse(view({ limits_use: use() })), {
    text: 'You hold 2 GiB of 4 GiB and 1 of 2 GPU kernels.',
    full: false
  });
  // the server says when a limit is reached (the next kernel is refused); the sidebar does not decide it
  assert.deepEqual(
    limitsUse(
      view({
        limits_use: use({ quota_mib: 4096, max_kernels: null, full: true })
      })
    ),
    { text: 'You hold 4 GiB of 4 GiB.', full: true }
  );
  assert.equal(
    limitsUse(
      view({
        limits_use: use({ max_total_mib: null, kernels: 0, max_kernels: 1 })
      })
    )?.text,
    'You hold 0 of 1 GPU kernel.'
  );
  // only a per-kernel limit: nothing to add up
  const perKernel = use({
    max_total_mib: null,
    max_kernels: null,
    max_kernel_mib: 8192
  });
  assert.equal(limitsUse(view({ limits_use: perKernel })), null);
  assert.equal(limitsUse(view({ limits_use: null })), null);
});

test('queue lines: mine in detail, another user’s entry says only that it is one', () => {
  assert.equal(
    queueEntryText({
      position: 2,
      mine: true,
      kernel_id: 'k2',
      kernel_name: 'python3',
      user: 'me',
      quota_mib: 2048,
      need_mib: 2560,
      waited_s: 75
    }),
    '#2 your python3 kernel k2, 2.5 GiB · waiting 1 min' // what it needs, as the banner says it
  );
  const hidden = queueEntryText({
    position: 1,
    mine: false,
    kernel_id: null,
    kernel_name: null,
    user: null,
    quota_mib: null,
    need_mib: null,
    waited_s: 12
  });
  assert.equal(hidden, '#1 another user’s kernel · waiting 12 s');
  assert.doesNotMatch(hidden, /null|undefined/);
  // an admin sees whose it is
  assert.equal(
    queueEntryText({
      position: 3,
      mine: false,
      kernel_id: 'k9',
      kernel_name: 'ir',
      user: 'alice',
      quota_mib: 1024,
      need_mib: 1536,
      waited_s: 3
    }),
    '#3 alice’s ir kernel k9, 1.5 GiB · waiting 3 s'
  );
});

test('a teacher tells every place in line apart: the notebook where this server runs it, else the kernel', () => {
  const entry = (kernel_id: string, user: string, mine: boolean) => ({
    position: 2,
    mine,
    kernel_id,
    kernel_name: 'python3',
    user,
    quota_mib: 7168,
    need_mib: 7680,
    waited_s: 30
  });
  // (the page's name for it: its folder too, as another notebook of the page has its name)
  const names: Record<string, string> = { 'aaaa1111-x': 'week3/lab.ipynb' };
  const nameOf = (id: string) => names[id] ?? null;
  const said = [
    entry('aaaa1111-x', 'me', true),
    entry('bbbb2222-x', 'me', true),
    entry('cccc3333-x', 'bob', false),
    entry('dddd4444-x', 'bob', false),
    { ...entry('eeee5555-x', 'carol', false), notebook: 'hw/demo.ipynb' } // (another server's, named by the broker)
  ].map(e => queueWho(e, nameOf));
  assert.deepEqual(said, [
    'your week3/lab.ipynb, 7.5 GiB',
    'your python3 kernel bbbb2222, 7.5 GiB',
    'bob’s python3 kernel cccc3333, 7.5 GiB',
    'bob’s python3 kernel dddd4444, 7.5 GiB',
    'carol’s demo.ipynb, 7.5 GiB'
  ]);
  assert.equal(new Set(said).size, said.length); // no two buttons with the same name
  const row = {
    kernelId: 'k',
    user: 'bob',
    name: 'demo.ipynb',
    card: '0',
    quota: '',
    age: '',
    title: '',
    mine: false
  };
  assert.equal(kernelWho(row), 'bob’s demo.ipynb');
  assert.equal(
    kernelWho({ ...row, user: 'me', mine: true }),
    'your demo.ipynb'
  );
});

test('kernel table rows: by user, oldest first; notebook names for this server’s kernels', () => {
  const v = view({
    admin: true,
    kernels: [
      hostKernel({ kernel_id: 'b-new-0000', user: 'bob', age_s: 10 }),
      hostKernel({ kernel_id: 'me-000000001', user: 'me', age_s: 100 }),
      hostKernel({
        kernel_id: 'b-old-0000',
        user: 'bob',
        age_s: 4000,
        kernel_name: 'ir',
        server_pid: null,
        kernel_pid: null
      }),
      hostKernel({ kernel_id: 'a-1-000000', user: 'alice', age_s: 5 }),
      hostKernel({
        kernel_id: 'c-1-000000',
        user: 'carol',
        age_s: 5,
        notebook: 'hw/demo.ipynb' // another server's, as the broker says it
      })
    ]
  });
  const rows = hostKernelRows(v, id =>
    id === 'me-000000001' ? 'lab.ipynb' : null
  );
  assert.deepEqual(
    rows.map(r => [r.user, r.kernelId]),
    [
      ['alice', 'a-1-000000'],
      ['bob', 'b-old-0000'],
      ['bob', 'b-new-0000'],
      ['carol', 'c-1-000000'],
      ['me', 'me-000000001']
    ]
  );
  assert.equal(rows[3].name, 'demo.ipynb');
  rows.splice(3, 1);
  assert.equal(rows[1].name, 'ir · b-old-00');
  assert.equal(rows[1].age, '1 h 6 min');
  assert.equal(rows[3].name, 'lab.ipynb');
  assert.equal(rows[3].mine, true);
  assert.equal(rows[0].mine, false);
  assert.equal(rows[0].quota, '2 GiB');
  assert.equal(rows[0].card, '0');
  assert.match(rows[0].title, /^kernel a-1-000000 \(python3\) on GPU 0: /);
  // a server in a container: its processes are not visible to the broker
  assert.match(rows[1].title, /server pid not visible, kernel pid not visible/);
  assert.match(rows[0].title, /server pid 100, kernel pid 101/);
  assert.match(rows[0].title, /2 GiB \+ 512 MiB CUDA context = 2\.5 GiB/);
});

test('kernel rows name a MIG instance by its label; an older server by index', () => {
  const rows = hostKernelRows(
    view({
      kernels: [
        hostKernel({ card_uuid: 'MIG-x', card_label: 'GPU 0 MIG 3' }),
        hostKernel({ kernel_id: 'old', card_index: 1 })
      ]
    })
  );
  assert.deepEqual(
    rows.map(r => r.card),
    ['0 MIG 3', '1']
  );
  assert.match(rows[0].title, / on GPU 0 MIG 3: quota /);
  assert.match(rows[1].title, / on GPU 1: quota /);
});

test('users total', () => {
  assert.deepEqual(
    usersTotal([
      { user: 'a', kernels: 2, quota_mib: 4096, reserved_mib: 5120 },
      { user: 'b', kernels: 1, quota_mib: 1024, reserved_mib: 1536 }
    ]),
    { kernels: 3, reserved_mib: 6656 }
  );
  assert.deepEqual(usersTotal([]), { kernels: 0, reserved_mib: 0 });
});
