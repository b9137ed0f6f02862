import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { EventCursor, ReplyGuard } from '../src/guard';

test('a reply for a kernel that is no longer current is dropped', () => {
  const g = new ReplyGuard<string>();
  g.setCurrent('k1');
  const t1 = g.ticket();
  g.setCurrent('k2'); // the user switched notebooks before the reply came
  const t2 = g.ticket();
  assert.equal(g.accept(t1), false);
  assert.equal(g.accept(t2), true);
});

test('switching away and back still drops the old reply', () => {
  const g = new ReplyGuard<string>();
  g.setCurrent('k1');
  const t1 = g.ticket();
  g.setCurrent('k2');
  g.setCurrent('k1');
  assert.equal(g.accept(t1), false);
  assert.equal(g.accept(g.ticket()), true);
});

test('an older reply arriving after a newer one for the same kernel is dropped', () => {
  const g = new ReplyGuard<string>();
  g.setCurrent('k1');
  const older = g.ticket();
  const newer = g.ticket();
  assert.equal(g.accept(newer), true);
  assert.equal(g.accept(older), false);
});

test('setting the same kernel again keeps tickets valid', () => {
  const g = new ReplyGuard<string>();
  g.setCurrent('k1');
  const t = g.ticket();
  g.setCurrent('k1');
  assert.equal(g.accept(t), true);
  assert.equal(g.current, 'k1');
});

test('events: first batch primes, each later event is shown once', () => {
  const c = new EventCursor();
  const old = [{ time: 10, kind: 'reserved', kernel_id: 'a', message: '' }];
  assert.deepEqual(c.take(old), []);
  assert.equal(c.since, 10);
  const e1 = { time: 11, kind: 'queued', kernel_id: 'b', message: '' };
  const e2 = { time: 12, kind: 'admitted', kernel_id: 'b', message: '' };
  assert.deepEqual(c.take([e1]), [e1]);
  // the server repeats an event at the boundary time: not shown again
  assert.deepEqual(c.take([e1, e2]), [e2]);
  assert.deepEqual(c.take([e2]), []);
  assert.equal(c.since, 12);
});

test('events: notifyFirst shows the first batch', () => {
  const c = new EventCursor();
  const e = { time: 1, kind: 'refused', kernel_id: null, message: 'x' };
  assert.deepEqual(c.take([e], true), [e]);
});
