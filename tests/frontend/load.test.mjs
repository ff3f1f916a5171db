// Unit tests of frontend/load.js (node --test): what the tab asks the server
// for a view, and how the answers become the plots' rows and step axes.
// Matrices are packed as tb_gradcheck/reader/wire.py packs them.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {decodeView, paneAxes, readAnswers, requestWidth, trackQuery, viewQuery, viewRequests} from '../../frontend/load.js';

const SEL = {run: 'twin_a', metric: 'grad_norm', granularity: 'layer', aggregate: 'last'};

// Little-endian float32, step-major, and numpy.packbits order for missing cells.
function f32(values) {
  return Buffer.from(new Float32Array(values).buffer).toString('base64');
}

function bits(flags) {
  const out = new Uint8Array(Math.ceil(flags.length / 8));
  flags.forEach((f, k) => {
    if (f) out[k >> 3] |= 1 << (7 - (k & 7));
  });
  return Buffer.from(out).toString('base64');
}

// A heatmap answer (encoding=f32): values[step][row], as the route sends it.
function heatmap(run, layers, steps, values, extra = {}) {
  return {
    run, metric: 'grad_norm', granularity: 'layer', aggregate: 'last', layers, steps, step_ends: null,
    encoding: 'f32', values_f32: f32(values.flat()), missing_bits: bits(values.flat().map(() => 0)),
    status: null, status_names: null, num_steps: steps.length, total_steps: steps.length, reduce: null, ...extra,
  };
}

const fulfilled = (value) => ({status: 'fulfilled', value: {stale: false, value}});
const rejected = (message) => ({status: 'rejected', reason: new Error(message)});

test('the_request_width_is_the_plot_in_device_pixels', () => {
  assert.equal(requestWidth(null, 1000, 2), 2000);
  assert.equal(requestWidth(null, 0, 1), 900); // hidden before the first answer
  assert.equal(requestWidth({width: 812.4}, 1000, 1), 812); // the last paint's plot, not the box around it
  assert.equal(requestWidth({width: 10}, 0, 1), 50);
  assert.equal(requestWidth(null, 700, undefined), 700);
});

test('the_query_carries_the_zoomed_steps', () => {
  assert.deepEqual(viewQuery(SEL, null, 1200), {...SEL, width: 1200, first_step: null, last_step: null});
  assert.deepEqual(viewQuery(SEL, {rows: [0, 3], steps: [40, 90]}, 600), {...SEL, width: 600, first_step: 40, last_step: 90});
  assert.equal(viewQuery(SEL, {rows: [0, 3], steps: null}, 600).first_step, null);
});

test('one_run_asks_its_heatmap_and_drops_the_comparison_channels', () => {
  const q = viewQuery(SEL, null, 1200);
  assert.deepEqual(viewRequests(SEL, null, {other: null, align: null}, q), {
    get: [{channel: 'main', url: 'heatmap?run=twin_a&metric=grad_norm&granularity=layer&aggregate=last&width=1200&encoding=f32'}],
    cancel: ['other', 'align'],
  });
});

test('side_by_side_asks_both_heatmaps_and_the_alignment', () => {
  const q = viewQuery(SEL, {rows: [0, 1], steps: [5, 9]}, 800);
  const {get, cancel} = viewRequests(SEL, 'side', {other: 'twin_b', align: null}, q);
  assert.deepEqual(cancel, []);
  assert.deepEqual(get.map((r) => r.channel), ['main', 'other', 'align']);
  assert.equal(get[1].url, 'heatmap?run=twin_b&metric=grad_norm&granularity=layer&aggregate=last&width=800&first_step=5&last_step=9&encoding=f32');
  assert.equal(get[2].url, 'align?run=twin_a&other=twin_b&granularity=layer&metric=grad_norm&align=auto');
  const byName = viewRequests(SEL, 'side', {other: 'twin_b', align: 'name'}, q);
  assert.match(byName.get[2].url, /&align=name$/);
});

test('a_ratio_asks_one_compare_answer_and_a_check_its_checks', () => {
  const q = viewQuery(SEL, null, 500);
  const ratio = viewRequests(SEL, 'ratio', {other: 'twin_b', align: 'structure'}, q);
  assert.deepEqual(ratio.get, [{channel: 'main',
    url: 'compare?run=twin_a&other=twin_b&metric=grad_norm&granularity=layer&aggregate=last&width=500&align=structure&encoding=f32'}]);
  assert.deepEqual(ratio.cancel, ['other', 'align']);
  const check = {...SEL, metric: 'check_error', aggregate: null};
  const side = viewRequests(check, 'side', {other: 'twin_b', align: null}, viewQuery(check, null, 500));
  assert.deepEqual(side.get.map((r) => r.channel), ['main', 'other', 'align', 'checks']);
  assert.equal(side.get[3].url, 'checks?run=twin_a&granularity=layer');
});

test('answers_a_newer_request_replaced_are_not_drawn', () => {
  const a = heatmap('twin_a', ['d'], [0], [[1]]);
  assert.deepEqual(readAnswers([fulfilled(a), {status: 'fulfilled', value: {stale: true}}], SEL, null, null), {stale: true});
});

test('a_failed_matrix_is_an_error_naming_what_failed', () => {
  const message = '404 Not Found: no metric no_such_metric in run twin_a';
  assert.deepEqual(readAnswers([rejected(message)], SEL, null, null), {error: `Could not load the heatmap: ${message}`});
  assert.deepEqual(readAnswers([rejected('400 Bad Request')], SEL, 'ratio', 'twin_b'),
    {error: 'Could not load the ratio twin_a \u00f7 twin_b: 400 Bad Request'});
});

test('side_by_side_without_the_compared_run_says_why_and_keeps_the_first', () => {
  const a = heatmap('twin_a', ['d'], [0], [[1]]);
  const r = readAnswers([fulfilled(a), rejected('404 Not Found: no run twin_b'), fulfilled({})], SEL, 'side', 'twin_b');
  assert.deepEqual(r, {a, b: null, aligned: null, checks: null, otherError: 'Could not load twin_b: 404 Not Found: no run twin_b'});
  // A ratio's rows are paired by the compare answer itself.
  assert.equal(readAnswers([fulfilled(a)], SEL, 'ratio', 'twin_b').aligned, a);
});

test('checks_are_read_for_a_check_and_a_failed_checks_answer_is_none', () => {
  const check = {...SEL, metric: 'check_error'};
  const a = heatmap('twin_a', ['d'], [0], [[1e-5]]);
  const checks = {step: 0, rows: [{name: 'd', min_detectable_error: 0.02}]};
  assert.deepEqual(readAnswers([fulfilled(a), fulfilled(checks)], check, null, null).checks, checks);
  assert.equal(readAnswers([fulfilled(a), rejected('500')], check, null, null).checks, null);
});

test('side_by_side_lays_both_grids_on_the_aligned_rows_and_one_step_axis', () => {
  // Keras twins, one layer inserted in b; b was written 10 steps longer.
  const a = heatmap('twin_a', ['s/dense', 's/dense_1'], [0, 1, 2], [[1, 2], [3, 4], [5, 6]]);
  const b = heatmap('twin_b', ['s_1/dense_2', 's_1/extra', 's_1/dense_3'], [0, 5, 10], [[7, 8, 9], [10, 11, 12], [13, 14, 15]]);
  const aligned = {alignment: 'structure', basis: 'shapes', matched: 2,
    run_layers: ['s/dense', null, 's/dense_1'], other_layers: ['s_1/dense_2', 's_1/extra', 's_1/dense_3'],
    only_in_run: [], only_in_other: ['s_1/extra']};
  const v = decodeView({a, b, aligned}, 'side', 'twin_a', 'twin_b');
  assert.deepEqual(v.names, ['s/dense', 's_1/extra', 's/dense_1']);
  assert.deepEqual(v.otherNames, ['s_1/dense_2', 's_1/extra', 's_1/dense_3']);
  assert.deepEqual(v.onlyIn, [[], ['s_1/extra']]);
  // Rows by steps: a lacks the inserted row (missing, absent), b has every row.
  assert.deepEqual(Array.from(v.main.grid.values), [1, 3, 5, 0, 0, 0, 2, 4, 6]);
  assert.deepEqual(Array.from(v.main.grid.absent), [0, 1, 0]);
  assert.deepEqual(Array.from(v.other.grid.values), [7, 10, 13, 8, 11, 14, 9, 12, 15]);
  assert.equal(v.main.run, 'twin_a');
  assert.equal(v.other.run, 'twin_b');
  assert.equal(v.main.resp, a);
  // One axis for both: steps 0..14 (b's last column is as wide as its 5-step gaps).
  assert.deepEqual([v.main.axis.first, v.main.axis.end], [0, 15]);
  assert.deepEqual([v.other.axis.first, v.other.axis.end], [0, 15]);
  assert.deepEqual(Array.from(v.main.axis.edges), [0, 1 / 15, 2 / 15, 3 / 15]);
  assert.deepEqual(v.other.axis.steps, [0, 5, 10]);
});

test('a_ratio_takes_its_rows_and_the_compared_names_from_the_compare_answer', () => {
  const a = heatmap('twin_a', ['s/dense', 's/dense_1'], [0, 1], [[0.5, 2], [1, 4]], {
    other: 'twin_b', alignment: 'structure', basis: 'shapes', matched: 2,
    run_layers: ['s/dense', 's/dense_1'], other_layers: ['s_1/dense_2', 's_1/dense_3'], only_in_run: [], only_in_other: [],
  });
  const v = decodeView({a, b: null, aligned: a}, 'ratio', 'twin_a', 'twin_b');
  assert.deepEqual(v.names, ['s/dense', 's/dense_1']);
  assert.deepEqual(v.otherNames, ['s_1/dense_2', 's_1/dense_3']);
  assert.deepEqual(v.onlyIn, [[], []]);
  assert.equal(v.other.grid, null);
  assert.equal(v.other.axis, null);
  assert.deepEqual([v.main.axis.first, v.main.axis.end], [0, 2]);
});

test('one_run_has_no_compared_names_and_a_malformed_answer_throws', () => {
  const a = heatmap('twin_a', ['d0', 'd1'], [0, 10, 20], [[1, 2], [3, 4], [5, 6]]);
  const v = decodeView({a, b: null, aligned: null}, null, 'twin_a', null);
  assert.equal(v.otherNames, null);
  assert.deepEqual(v.onlyIn, [[], []]);
  assert.equal(v.main.grid.rows, 2);
  assert.equal(v.main.axis.end, 30); // a check written every 10 steps keeps 10-step cells to the end
  const bad = {...a, values_f32: f32([1, 2, 3])};
  assert.throws(() => decodeView({a: bad, b: null, aligned: null}, null, 'twin_a', null), /Expected 6 float32 values/);
});

test('pane_axes_of_binned_columns_end_after_the_last_bin', () => {
  const a = {steps: [0, 100], step_ends: [99, 199]};
  const b = {steps: [50, 150], step_ends: [149, 249]};
  const axes = paneAxes(a, b);
  assert.deepEqual([axes.main.first, axes.main.end, axes.other.first, axes.other.end], [0, 250, 0, 250]);
  assert.deepEqual(axes.other.stepEnds, [149, 249]);
  assert.equal(paneAxes(a, null).other, null);
});

test('the_loss_scale_track_asks_with_the_heatmaps_width_binning_and_zoom', () => {
  const q = viewQuery({...SEL, granularity: 'variable'}, {rows: [0, 1], steps: [10, 20]}, 640);
  assert.deepEqual(trackQuery(q, 'max'), {run: 'twin_a', granularity: 'layer', width: 640, reduce: 'max', first_step: 10, last_step: 20});
});
