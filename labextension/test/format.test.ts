import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import {
  basename,
  cardLabel,
  formatDuration,
  formatGiB,
  formatMiB,
  formatPercent,
  formatUsage,
  parseSize
} from '../src/format';

test('formatMiB picks MiB below 1 GiB, GiB above, and a dash when unknown', () => {
  assert.equal(formatMiB(0), '0 MiB');
  assert.equal(formatMiB(512), '512 MiB');
  assert.equal(formatMiB(1023.6), '1024 MiB');
  assert.equal(formatMiB(1024), '1.0 GiB');
  assert.equal(formatMiB(1229), '1.2 GiB');
  assert.equal(formatMiB(143771), '140.4 GiB');
  assert.equal(formatMiB(2 * 1024 * 1024), '2.0 TiB');
  assert.equal(formatMiB(null), '–');
  assert.equal(formatMiB(undefined), '–');
  assert.equal(formatMiB(NaN), '–');
});

test('formatGiB: one unit for figures side by side, a dash when unknown', () => {
  assert.equal(formatGiB(512), '0.5 GiB');
  assert.equal(formatGiB(2560), '2.5 GiB');
  assert.equal(formatGiB(0), '0.0 GiB');
  assert.equal(formatGiB(81920), '80.0 GiB');
  assert.equal(formatGiB(null), '–');
  assert.equal(formatGiB(undefined), '–');
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

test('parseSize understands the server’s size strings', () => {
  assert.equal(parseSize('6GiB'), 6144);
  assert.equal(parseSize('6 GiB'), 6144);
  assert.equal(parseSize('4G'), 4096);
  assert.equal(parseSize('1.5g'), 1536);
  assert.equal(parseSize('512MiB'), 512);
  assert.equal(parseSize('512'), 512);
  assert.equal(parseSize('1TiB'), 1024 * 1024);
  assert.equal(parseSize('25%', 10240), 2560);
  assert.equal(parseSize('25%'), null);
  assert.equal(parseSize('150%', 10240), null);
  assert.equal(parseSize('lots'), null);
  assert.equal(parseSize('6 GiBs'), null);
  assert.equal(parseSize(''), null);
});

test('small helpers', () => {
  assert.equal(formatPercent(33.6), '34%');
  assert.equal(formatPercent(null), '–');
  assert.equal(formatDuration(5.4), '5 s');
  assert.equal(formatDuration(125), '2 min');
  assert.equal(formatDuration(7500), '2 h 5 min');
  assert.equal(formatDuration(7200), '2 h');
  assert.equal(basename('course/week1/mnist.ipynb'), 'mnist.ipynb');
  assert.equal(basename('/abs/path/x.ipynb'), 'x.ipynb');
  assert.equal(basename('C:\\u\\y.ipynb'), 'y.ipynb');
  assert.equal(basename(null), '');
});

test('cardLabel: the server\'s label, else "GPU <index>"', () => {
  assert.equal(cardLabel({ index: 0, label: 'GPU 0 MIG 3' }), 'GPU 0 MIG 3');
  assert.equal(cardLabel({ index: 2 }), 'GPU 2');
});
