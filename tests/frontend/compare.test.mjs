// Unit tests of frontend/compare.js (node --test): aligning two runs' rows.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {alignRows, alignmentText, chooseAlignment, matchedRows, rootScope, structureKey} from '../../frontend/compare.js';

const SEQ = ['sequential/dense/kernel', 'sequential/dense/bias', 'sequential/dense_1/kernel'];
const SEQ1 = ['sequential_1/dense/kernel', 'sequential_1/dense/bias', 'sequential_1/dense_1/kernel'];

test('structure_key_drops_the_root_scope_only', () => {
  assert.equal(structureKey('sequential_1/dense/kernel'), 'dense/kernel');
  assert.equal(structureKey('he_init/dense'), 'dense');
  assert.equal(structureKey('dense'), 'dense');
  assert.equal(structureKey('trailing/'), 'trailing/');
  assert.equal(rootScope('he_init/dense'), 'he_init');
  assert.equal(rootScope('dense'), '');
});

test('runs_whose_models_got_different_names_align_by_structure', () => {
  assert.equal(matchedRows(SEQ, SEQ1, 'name'), 0);
  assert.equal(matchedRows(SEQ, SEQ1, 'structure'), 3);
  const choice = chooseAlignment(SEQ, SEQ1);
  assert.deepEqual(choice, {mode: 'structure', matched: 3, roots: ['sequential', 'sequential_1']});
  const al = alignRows(SEQ, SEQ1, 'structure');
  assert.deepEqual(al.names, SEQ);
  assert.deepEqual(Array.from(al.pickB), [0, 1, 2]);
  assert.deepEqual(al.onlyA, []);
  assert.match(alignmentText(choice, 'a', 'b', 3, 3), /aligned by structure \(sequential\/\u2026 \u2194 sequential_1\/\u2026\): 3 of 3 rows/);
});

test('same_names_stay_aligned_by_name_and_name_alignment_stays_available', () => {
  assert.equal(chooseAlignment(SEQ, SEQ).mode, 'name');
  const byName = alignRows(SEQ, SEQ1, 'name');
  assert.equal(byName.names.length, 6);
  assert.deepEqual(byName.onlyA, SEQ);
  assert.deepEqual(byName.onlyB, SEQ1);
  assert.deepEqual(Array.from(byName.pickA), [0, 1, 2, -1, -1, -1]);
});

test('an_extra_layer_is_only_in_its_run_and_each_row_is_used_once', () => {
  const a = ['he_init/dense', 'he_init/extra', 'he_init/out'];
  const b = ['wrong_gradient/dense', 'wrong_gradient/out', 'wrong_gradient/more'];
  const al = alignRows(a, b, chooseAlignment(a, b).mode);
  assert.deepEqual(al.names, ['he_init/dense', 'he_init/extra', 'he_init/out', 'wrong_gradient/more']);
  assert.deepEqual(Array.from(al.pickB), [0, -1, 1, 2]);
  assert.deepEqual(al.onlyA, ['he_init/extra']);
  assert.deepEqual(al.onlyB, ['wrong_gradient/more']);
  // Two rows of a with one key take b's row once.
  const dup = alignRows(['x/a', 'y/a'], ['z/a'], 'structure');
  assert.deepEqual(Array.from(dup.pickB), [0, -1]);
});
