// Unit tests of frontend/compare.js (node --test): laying two runs' rows out
// on the server's alignment, and the note that says which one it is.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {alignmentOf, alignmentText, alignRows, ownLabels, rootScope} from '../../frontend/compare.js';
import {buildPlan, groupRows} from '../../frontend/rows.js';

// Auto-numbered Keras twins, one layer inserted in the second, as GET align answers them.
const A = ['sequential/dense', 'sequential/dense_1', 'sequential/dense_2'];
const B = ['sequential_1/dense_3', 'sequential_1/dense_4', 'sequential_1/inserted', 'sequential_1/dense_5'];
const ANSWER = {
  alignment: 'structure', basis: 'shapes', matched: 3,
  layers: [A[0], A[1], 'sequential_1/inserted', A[2]],
  run_layers: [A[0], A[1], null, A[2]],
  other_layers: [B[0], B[1], B[2], B[3]],
  only_in_run: [], only_in_other: ['sequential_1/inserted'],
};

test('root_scope_is_the_first_path_component', () => {
  assert.equal(rootScope('he_init/dense'), 'he_init');
  assert.equal(rootScope('dense'), '');
});

test('rows_follow_the_answer_with_an_inserted_layer_at_its_depth', () => {
  const al = alignRows(ANSWER, A, B);
  assert.deepEqual(al.names, [A[0], A[1], 'sequential_1/inserted', A[2]]);
  assert.deepEqual(Array.from(al.pickA), [0, 1, -1, 2]);
  assert.deepEqual(Array.from(al.pickB), [0, 1, 2, 3]);
  assert.deepEqual(al.onlyA, []);
  assert.deepEqual(al.onlyB, ['sequential_1/inserted']);
  const shown = alignmentOf(ANSWER);
  assert.deepEqual(shown, {mode: 'structure', basis: 'shapes', matched: 3, total: 4, roots: ['sequential', 'sequential_1']});
  assert.equal(alignmentText(shown, 'a', 'b', 3, 4),
    'rows aligned by structure (depth and shapes; sequential/\u2026 \u2194 sequential_1/\u2026): 3 of 4 rows in both a and b');
});

test('a_heatmap_row_the_answer_does_not_name_is_kept_as_only_in_its_run', () => {
  // The run grew a layer between the align request and the heatmap's.
  const al = alignRows(ANSWER, [...A, 'sequential/late'], B);
  assert.deepEqual(al.names.slice(-1), ['sequential/late']);
  assert.deepEqual(al.onlyA, ['sequential/late']);
  // A name the heatmap lacks is never indexed: its partner stays, as only in the other run.
  const gone = alignRows(ANSWER, A.slice(0, 2), B);
  assert.deepEqual(Array.from(gone.pickA), [0, 1, -1, -1]);
  assert.deepEqual(gone.onlyB, ['sequential_1/inserted', 'sequential_1/dense_5']);
});

test('the_note_says_name_alignment_and_what_structure_was_based_on', () => {
  const byName = alignmentOf({alignment: 'name', basis: 'names', matched: 0, run_layers: [A[0], null], other_layers: [null, B[0]],
    only_in_run: [A[0]], only_in_other: [B[0]]});
  assert.equal(byName.total, 2);
  assert.equal(alignmentText(byName, 'a', 'b', 0, 2), 'rows aligned by name: 0 of 2 rows in both a and b');
  const old = {mode: 'structure', basis: 'sizes', roots: ['x', 'x']};
  assert.match(alignmentText(old, 'a', 'b', 1, 1), /by structure \(depth and sizes \(this log stores no shapes\)\): 1 of 1/);
});

test('the_compared_run_labels_its_rows_with_its_own_names', () => {
  // Two transformers whose roots differ, one block only in the first run.
  const a = ['enc/block_0/q', 'enc/block_0/k', 'enc/block_1/q', 'enc/block_1/k', 'enc/head'];
  const own = ['model_b/block_0/q', 'model_b/block_0/k', null, null, 'model_b/head'];
  const groups = groupRows(a);
  assert.deepEqual(groups.map((g) => g.key), ['enc/block_0/', 'enc/block_1/']);
  const plan = buildPlan(a, groups);
  const mine = ownLabels(plan, groups, a, own);
  // Aligned rows under the second run's names; rows only the first run has keep its names.
  assert.deepEqual(mine.labels, ['model_b/block_0/q', 'model_b/block_0/k', 'enc/block_1/q', 'enc/block_1/k', 'model_b/head']);
  assert.deepEqual(mine.names, mine.labels);
  assert.deepEqual(mine.groupKeys, ['model_b/block_0/', 'enc/block_1/']);
  // A collapsed group: one row under the second run's key, its row count as the plan's.
  const collapsed = new Set(['enc/block_0/']);
  const folded = ownLabels(buildPlan(a, groups, {collapsed}), groups, a, own, collapsed);
  assert.deepEqual(folded.labels, ['model_b/block_0/ (2)', 'enc/block_1/q', 'enc/block_1/k', 'model_b/head']);
  // Filtered down to one row of a collapsed group, it is still the group's row.
  const one = ownLabels(buildPlan(a, groups, {collapsed, filter: 'q'}), groups, a, own, collapsed);
  assert.deepEqual(one.labels, ['model_b/block_0/ (1)', 'enc/block_1/q']);
});

test('the_compared_run_labels_rows_named_by_an_index_with_their_class', () => {
  // Two nn.Sequential models: the second run's answer labels its own rows, as the first run's show theirs.
  const a = ['0', '2', '4'];
  const own = ['0', '2', null];
  const groups = groupRows(a);
  const labelled = ownLabels(buildPlan(a, groups), groups, a, own, new Set(), {0: '0 (Conv2d)', 2: '2 (Linear)'});
  assert.deepEqual(labelled.labels, ['0 (Conv2d)', '2 (Linear)', '4']);
  assert.deepEqual(labelled.names, ['0', '2', '4'], 'the names stay the stored ones');
});
