// Unit tests of frontend/rows.js (node --test): groups, the display plan,
// fitting rows into the visible height, binning keeping extremes.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {pixelColumns, stepAxis} from '../../frontend/axes.js';
import {
  binEdges, binGrid, buildPlan, fitHeight, fitLabel, groupRows, labelledRows, mergeCellRuns, planRows, sharedPrefix,
  sourceRows,
} from '../../frontend/rows.js';

// A 250-block transformer: 8 rows per block, 2,000 rows.
const PARTS = ['attn/q', 'attn/k', 'attn/v', 'attn/o', 'mlp/in', 'mlp/out', 'ln1', 'ln2'];
const BLOCKS = [];
for (let b = 0; b < 250; b++) for (const p of PARTS) BLOCKS.push(`transformer/block_${String(b).padStart(3, '0')}/${p}`);

function grid(rows, cols, fill = 1) {
  return {rows, cols, rowStart: 0, values: new Float64Array(rows * cols).fill(fill), missing: new Uint8Array(rows * cols), status: null};
}

function identityColumns(cols) {
  return pixelColumns(stepAxis(Array.from({length: cols}, (_, c) => c), null).edges, cols);
}

test('shared_prefix_drops_only_whole_path_parts', () => {
  assert.equal(sharedPrefix(['sequential/dense', 'sequential/dense_1']), 'sequential/');
  assert.equal(sharedPrefix(['model/enc/a', 'model/enc/b', 'model/dec/c']), 'model/');
  assert.equal(sharedPrefix(['a/x', 'b/y']), '');
  assert.equal(sharedPrefix(['seq/a']), '');
  assert.equal(sharedPrefix(['seq/', 'seq/a']), '');
  assert.equal(sharedPrefix(['dense', 'dense_1']), '');
});

test('fit_label_cuts_the_middle', () => {
  const measure = (s) => s.length * 6;
  assert.equal(fitLabel('dense', 100, measure), 'dense');
  const long = 'encoder/block_11/attention/query/kernel';
  const cut = fitLabel(long, 120, measure);
  assert.ok(measure(cut) <= 120, cut);
  assert.ok(cut.includes('\u2026'));
  assert.ok(cut.endsWith('kernel'));
  assert.ok(cut.startsWith('enc'));
});

test('merge_cell_runs_joins_adjacent_rows_with_the_same_columns', () => {
  assert.deepEqual(mergeCellRuns([[2, 0, 9], [0, 0, 9], [1, 0, 9], [4, 0, 9], [5, 3, 4]]), [
    [0, 2, 0, 9], [4, 4, 0, 9], [5, 5, 3, 4],
  ]);
  assert.deepEqual(mergeCellRuns([]), []);
});

test('bin_edges_cover_everything', () => {
  assert.deepEqual(Array.from(binEdges(10, 3)), [0, 3, 6, 10]);
  assert.deepEqual(Array.from(binEdges(3, 3)), [0, 1, 2, 3]);
});

test('groups_are_the_repeated_blocks_not_their_insides', () => {
  const groups = groupRows(BLOCKS);
  assert.equal(groups.length, 250);
  assert.deepEqual(groups[3], {key: 'transformer/block_003/', label: 'block_003/', start: 24, end: 32});
  // encoder/decoder halves split further into their blocks.
  const ed = groupRows(['m/enc/b0/x', 'm/enc/b0/y', 'm/enc/b1/x', 'm/enc/b1/y', 'm/dec/b0/x', 'm/dec/b0/y']);
  assert.deepEqual(ed.map((g) => g.key), ['m/enc/b0/', 'm/enc/b1/', 'm/dec/b0/']);
  // Variables group by their layer; a plain MLP's layers are no groups.
  assert.deepEqual(groupRows(['s/dense/kernel', 's/dense/bias', 's/dense_1/kernel', 's/dense_1/bias']).map((g) => g.key),
    ['s/dense/', 's/dense_1/']);
  assert.deepEqual(groupRows(['mlp/dense_0', 'mlp/dense_1', 'mlp/dense_2']), []);
});

test('plan_collapses_groups_filters_and_zooms', () => {
  const groups = groupRows(BLOCKS);
  const all = buildPlan(BLOCKS, groups);
  assert.equal(planRows(all), 2000);
  const collapsed = buildPlan(BLOCKS, groups, {collapsed: new Set(groups.map((g) => g.key))});
  assert.equal(planRows(collapsed), 250);
  assert.equal(collapsed.labels[1], 'transformer/block_001/ (8)');
  assert.deepEqual(sourceRows(collapsed, 1, 1), [8, 9, 10, 11, 12, 13, 14, 15]);
  const filtered = buildPlan(BLOCKS, groups, {filter: 'MLP/OUT'});
  assert.equal(planRows(filtered), 250);
  assert.ok(filtered.labels.every((l) => l.endsWith('mlp/out')));
  // A collapsed block under a filter covers its matching rows only.
  const both = buildPlan(BLOCKS, groups, {collapsed: new Set([groups[0].key]), filter: 'attn'});
  assert.equal(both.labels[0], 'transformer/block_000/ (4)');
  const zoomed = buildPlan(BLOCKS, groups, {range: [16, 31]});
  assert.equal(planRows(zoomed), 16);
  assert.equal(zoomed.labels[0], BLOCKS[16]);
  assert.equal(zoomed.first[0], 1);
  assert.equal(zoomed.first[1], 0);
});

test('every_row_fits_the_visible_height', () => {
  assert.deepEqual(fitHeight(10, 600), {rowHeight: 24, height: 240});
  const many = fitHeight(2000, 600);
  assert.equal(many.height, 600);
  assert.ok(many.rowHeight < 1);
  assert.deepEqual(fitHeight(0, 600), {rowHeight: 0, height: 0});
});

test('binning_2000_rows_into_600_pixels_keeps_a_lone_nan_and_spike', () => {
  const g = grid(2000, 50, 1e-3);
  g.values[1234 * 50 + 17] = NaN;
  g.values[77 * 50 + 3] = 5;
  g.missing.fill(1, 1999 * 50, 2000 * 50);
  const plan = buildPlan(BLOCKS, groupRows(BLOCKS));
  const b = binGrid(g, plan, binEdges(2000, 600), identityColumns(50));
  assert.equal(b.rows, 600);
  const binOf = (r) => b.rowBins.findIndex((e, i) => r >= e && r < b.rowBins[i + 1]);
  assert.ok(Number.isNaN(b.values[binOf(1234) * 50 + 17]));
  assert.equal(b.values[binOf(77) * 50 + 3], 5);
  assert.equal(b.values[binOf(500) * 50 + 3], 1e-3);
  assert.equal(b.missing[599 * 50], 0, 'a bin with one present row is present');
});

test('binning_keeps_nan_over_inf_and_missing_only_when_all_missing', () => {
  const g = grid(1, 4);
  g.values.set([Infinity, NaN, -Infinity, 2]);
  g.missing.set([0, 0, 0, 1]);
  const plan = buildPlan(['a'], []);
  const two = pixelColumns(stepAxis([0, 1, 2, 3], null).edges, 2);
  const b = binGrid(g, plan, binEdges(1, 1), two);
  assert.ok(Number.isNaN(b.values[0]));
  assert.equal(b.values[1], -Infinity);
  const m = grid(1, 2);
  m.missing.fill(1);
  assert.equal(binGrid(m, plan, binEdges(1, 1), identityColumns(2)).missing[0], 1);
});

test('binning_keeps_the_most_severe_status_code', () => {
  const g = grid(2, 1);
  g.status = Int8Array.from([0, 2]);
  const b = binGrid(g, buildPlan(['a', 'b'], []), binEdges(2, 1), identityColumns(1));
  assert.deepEqual(Array.from(b.status), [2]);
});

test('thinned_labels_name_blocks_and_keep_apart', () => {
  const plan = buildPlan(BLOCKS, groupRows(BLOCKS));
  const rowHeight = 600 / 2000;
  const rows = labelledRows(plan, rowHeight);
  assert.ok(rows.length > 10 && rows.length <= Math.ceil(600 / 14) + 1, rows.length);
  assert.ok(rows.every((d) => plan.first[d] === 1), 'labels go on the first row of a block');
  for (let i = 1; i < rows.length; i++) assert.ok((rows[i] - rows[i - 1]) * rowHeight >= 14);
  assert.equal(labelledRows(buildPlan(['a', 'b'], []), 20).length, 2);
});

test('chart_envelope_is_min_median_max_of_values_on_the_scale', async () => {
  const {envelope} = await import('../../frontend/chart.js');
  const g = {rows: 4, cols: 2, values: Float64Array.from([0.1, 0, 0.5, NaN, 0.9, -1, 0.3, 0.2]), missing: Uint8Array.from([0, 1, 0, 0, 0, 0, 0, 0])};
  const log = envelope(g, 'log');
  assert.deepEqual([log.lo[0], log.mid[0], log.hi[0]], [0.1, 0.4, 0.9]);
  assert.equal(log.mid[1], 0.2); // missing, NaN and -1 are not on a log scale
  const lin = envelope(g, 'linear');
  assert.equal(lin.lo[1], -1);
  assert.equal(lin.mid[1], -0.4);
});

test('thinned_labels_at_the_bottom_do_not_overlap_the_one_above', () => {
  const names = Array.from({length: 200}, (_, i) => `layer_${String(i).padStart(3, '0')}`);
  const rowHeight = 430 / 200;
  const rows = labelledRows(buildPlan(names, []), rowHeight);
  const at = (d) => Math.min(Math.max(7, (d + 0.5) * rowHeight), 200 * rowHeight - 7);
  for (let i = 1; i < rows.length; i++) assert.ok(at(rows[i]) - at(rows[i - 1]) >= 14, `${rows[i - 1]} ${rows[i]}`);
});

test('a_row_named_by_an_index_shows_and_is_found_by_its_label', () => {
  const names = ['0', '2', 'head'];
  const display = {0: '0 (Linear)', 2: '2 (Linear)'};
  const plan = buildPlan(names, [], {display});
  assert.deepEqual(plan.labels, ['0 (Linear)', '2 (Linear)', 'head']);
  assert.deepEqual(Array.from(buildPlan(names, [], {display, filter: 'linear'}).order), [0, 1]);
  assert.deepEqual(buildPlan(names, []).labels, names); // no labels: the names
});
