import { strict as assert } from 'node:assert';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';

import {
  basename,
  cardLabel,
  formatDuration,
  formatMiB,
  formatPercent,
  formatUsage,
  isTemporaryPath,
  notebookName
} from '../src/format';
import { say } from '../src/words';

// The same table as the server's (tests/server/test_contract.py): one rule for sizes and times, on both sides
const CASES = JSON.parse(
  readFileSync(join(__dirname, '..', '..', 'test', 'format-cases.json'), 'utf8')
) as {
  sizes: [number, string][];
  durations: [number, string][];
  sentences: [string, Record<string, unknown>, string][];
};

test('figures and sentences are said as the server says them', () => {
  for (const [mib, text] of CASES.sizes) {
    assert.equal(formatMiB(mib), text, String(mib));
  }
  for (const [s, text] of CASES.durations) {
    assert.equal(formatDuration(s), text, String(s));
  }
  for (const [code, params, text] of CASES.sentences) {
    assert.equal(say(code, params), text, code);
  }
  assert.equal(formatMiB(null), '–');
  assert.equal(formatMiB(undefined), '–');
  assert.equal(formatMiB(NaN), '–');
});

test('formatUsage: one unit from the total, dash while use is not measured', () => {
  assert.equal(formatUsage(1229, 4096), '1.2 / 4.0 GiB');
  assert.equal(formatUsage(null, 4096), '– / 4.0 GiB');
  assert.equal(formatUsage(undefined, 4096), '– / 4.0 GiB');
  assert.equal(formatUsage(300, 512), '300 / 512 MiB');
  assert.equal(formatUsage(0, 3072), '0.0 / 3.0 GiB');
  assert.equal(formatUsage(5000, 4096), '4.9 / 4.0 GiB');
  assert.equal(formatUsage(100, null), '100 MiB / –');
});

test('small helpers', () => {
  assert.equal(formatPercent(33.6), '34%');
  assert.equal(formatPercent(null), '–');
  assert.equal(basename('course/week1/mnist.ipynb'), 'mnist.ipynb');
  assert.equal(basename('/abs/path/x.ipynb'), 'x.ipynb');
  assert.equal(basename('C:\\u\\y.ipynb'), 'y.ipynb');
  assert.equal(basename(null), '');
});

test('cardLabel: the server\'s label, else "GPU <index>"', () => {
  assert.equal(cardLabel({ index: 0, label: 'GPU 0 MIG 3' }), 'GPU 0 MIG 3');
  assert.equal(cardLabel({ index: 2 }), 'GPU 2');
});

test('notebook names: the file name, the relative path where two collide, never a temporary UUID path', () => {
  const temp = '35f7ece3-8124-4c7b-9f0e-0c1d2e3f4a5b';
  assert.equal(isTemporaryPath(temp), true);
  assert.equal(isTemporaryPath('week2/a.ipynb'), false);
  assert.equal(notebookName(temp), '');
  assert.equal(notebookName('week2/a.ipynb'), 'a.ipynb');
  assert.equal(notebookName('a.ipynb', ['week2/a.ipynb']), 'a.ipynb');
  assert.equal(notebookName('week2/a.ipynb', ['a.ipynb']), 'week2/a.ipynb');
  assert.equal(
    notebookName('week2/a.ipynb', ['week2/b.ipynb', temp, null]),
    'a.ipynb'
  );
});

test('sizes in GiB round halves up, in formatMiB and formatUsage alike', () => {
  assert.equal(formatMiB(15616), '15.3 GiB');
  assert.equal(formatUsage(15616, 15616), '15.3 / 15.3 GiB');
});
