import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { codeHash } from '../src/heldcell';

// The same three as tests/bootstrap/test_bootstrap.py gives the kernel's code_hash: a held cell is found by it
export const CASES: [string, string][] = [
  ['', '811c9dc5'],
  ['import torch', '8c1b558e'],
  ['x = "é→🙂"\nprint(x)', '3b9b98f8']
];

test("a cell's code hashes as the kernel hashes it (FNV-1a of its UTF-8)", () => {
  for (const [code, hash] of CASES) {
    assert.equal(codeHash(code), hash);
  }
});
