// Unit tests of the compare, findings and live-refresh helpers (node --test):
// diverging ratio scale, highlight ranges, row alignment, finding cells and
// marks, evidence text, poll decisions.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  LUT_SIZE, MIN_RATIO_DECADES, RATIO_LUT, RATIO_SPECIAL_COLORS, SPECIAL_COLORS, colorize, columnRange, makeRatioScale,
  mergeCellRuns, ratioDecades, traceEnvelope, makeScale,
} from '../../frontend/heatmap.js';
import {
  alignRows, compareUrl, evidenceItems, findingCells, findingKey, findingsUrl, formatNumber, granularitiesWithMetric,
  layerHeadline, reconcileSelection, rowMarks, runsChanged, sortFindings, stepRangeText, unionRows,
} from '../../frontend/model.js';
import {ratioTickLabel} from '../../frontend/views.js';

const lutAt = (i) => Array.from(RATIO_LUT.slice(i * 4, i * 4 + 3));

test('ratio_lut_is_blue_below_white_at_one_red_above', () => {
  assert.equal(RATIO_LUT.length, LUT_SIZE * 4);
  const [r0, , b0] = lutAt(0);
  const [r1, , b1] = lutAt(LUT_SIZE - 1);
  assert.ok(b0 > r0 + 100, 'low end is blue');
  assert.ok(r1 > b1 + 100, 'high end is red');
  for (const c of [...lutAt(127), ...lutAt(128)]) assert.ok(c >= 240, 'centre is near white');
  // Special colours of the ratio map are none of its own colours.
  for (const special of Object.values(RATIO_SPECIAL_COLORS)) {
    for (let i = 0; i < LUT_SIZE; i++) {
      const d = lutAt(i).reduce((s, c, k) => s + Math.abs(c - special[k]), 0);
      assert.ok(d > 60, `special ${special} is close to LUT entry ${i}`);
    }
  }
});

test('ratio_scale_is_symmetric_in_decades_and_has_a_floor', () => {
  assert.equal(ratioDecades([1e-3, 10, 1], null), 3);
  assert.equal(ratioDecades([1.01, 0.99], null), MIN_RATIO_DECADES);
  assert.equal(ratioDecades([0, Infinity, NaN, 1e9], new Uint8Array([0, 0, 0, 1])), MIN_RATIO_DECADES);
  const s = makeRatioScale(3);
  assert.equal(s.kind, 'log');
  assert.ok(s.diverging);
  assert.ok(Math.abs(s.unit(1) - 0.5) < 1e-12);
  assert.ok(Math.abs(s.unit(1e-3)) < 1e-12 && Math.abs(s.unit(1e3) - 1) < 1e-12);
  assert.ok(Math.abs(s.unit(10) - (1 - s.unit(0.1))) < 1e-12);
});

test('colorize_uses_the_ratio_scale_lut_and_specials', () => {
  const g = {rows: 1, cols: 5, values: Float64Array.from([1e-3, 1, 1e3, NaN, 0]), missing: Uint8Array.from([0, 0, 0, 0, 0])};
  const px = colorize(g, makeRatioScale(3));
  const at = (i) => Array.from(px.slice(i * 4, i * 4 + 3));
  assert.deepEqual(at(0), lutAt(0));
  assert.deepEqual(at(2), lutAt(255));
  assert.ok(at(1).every((c) => c >= 240));
  assert.deepEqual(at(3), [...RATIO_SPECIAL_COLORS.nonfinite]);
  assert.deepEqual(at(4), [...RATIO_SPECIAL_COLORS.zero]);
  // The plain log scale still uses viridis and the usual specials.
  const plain = colorize(g, makeScale('log', {min: 1e-3, max: 1e3}));
  assert.deepEqual(Array.from(plain.slice(12, 15)), [...SPECIAL_COLORS.nonfinite]);
});

test('ratio_tick_labels_read_as_factors', () => {
  assert.equal(ratioTickLabel(1), '1\u00d7');
  assert.equal(ratioTickLabel(0.5), '0.5\u00d7');
  assert.equal(ratioTickLabel(1000), '1000\u00d7');
  assert.equal(ratioTickLabel(1e-6), '1e-6\u00d7');
  assert.equal(ratioTickLabel(1e6), '1e6\u00d7');
});

test('column_range_finds_the_columns_of_a_step_range', () => {
  const steps = [0, 10, 20, 30];
  assert.deepEqual(columnRange(steps, null, 10, 20), [1, 2]);
  assert.deepEqual(columnRange(steps, null, 5, 25), [1, 2]); // 5 is in a gap: first column after it
  assert.deepEqual(columnRange(steps, null, -5, 100), [0, 3]);
  assert.equal(columnRange(steps, null, 11, 19), null); // only a gap
  assert.equal(columnRange(steps, null, 40, 50), null);
  // Binned columns hold [steps[c], stepEnds[c]].
  assert.deepEqual(columnRange([0, 50, 100], [49, 99, 149], 60, 60), [1, 1]);
  assert.deepEqual(columnRange([0, 50, 100], [49, 99, 149], 49, 100), [0, 2]);
  assert.equal(columnRange([], null, 0, 1), null);
});

test('merge_cell_runs_joins_adjacent_rows_with_the_same_columns', () => {
  assert.deepEqual(mergeCellRuns([[2, 0, 9], [0, 0, 9], [1, 0, 9], [4, 0, 9], [5, 3, 4]]), [
    [0, 2, 0, 9], [4, 4, 0, 9], [5, 5, 3, 4],
  ]);
  assert.deepEqual(mergeCellRuns([]), []);
});

test('trace_envelope_takes_min_median_max_of_on_scale_values', () => {
  const g = {
    rows: 3, cols: 2,
    values: Float64Array.from([0.1, 0, 0.5, NaN, 0.9, 0.2]),
    missing: Uint8Array.from([0, 1, 0, 0, 0, 0]),
  };
  const env = traceEnvelope(g, makeScale('linear', {min: 0, max: 1}).unit);
  assert.deepEqual([env.lo[0], env.mid[0], env.hi[0]].map((v) => Number(v.toFixed(6))), [0.1, 0.5, 0.9]);
  assert.equal(env.lo[1], 0.2); // the missing and the NaN cell are not on the scale
  assert.equal(env.mid[1], 0.2);
});

test('compare_and_findings_urls_are_relative_and_encoded', () => {
  const url = compareUrl({run: 'a&b', other: 'c d', metric: 'grad_norm', granularity: 'layer', aggregate: 'max', width: 800.2});
  assert.equal(url, 'compare?run=a%26b&other=c+d&metric=grad_norm&granularity=layer&aggregate=max&width=800&encoding=f32');
  assert.equal(findingsUrl('x/y'), 'findings?run=x%2Fy');
});

const CHECK_RUN = {
  run: 'checked',
  metrics: ['grad_norm', 'check_error'],
  aggregates: {grad_norm: ['last']},
  granularities: {
    layer: {rows: ['m/d0', 'm/d1'], metrics: ['grad_norm', 'check_error']},
    variable: {rows: ['m/d0/kernel', 'm/d0/bias', 'm/d1/kernel'], metrics: ['grad_norm']},
  },
};

test('granularities_without_the_metric_are_not_chosen', () => {
  assert.deepEqual(granularitiesWithMetric(CHECK_RUN, 'check_error'), ['layer']);
  assert.deepEqual(granularitiesWithMetric(CHECK_RUN, 'grad_norm'), ['layer', 'variable']);
  const sel = reconcileSelection([CHECK_RUN], {run: 'checked', metric: 'check_error', granularity: 'variable'});
  assert.equal(sel.granularity, 'layer');
  assert.equal(reconcileSelection([CHECK_RUN], {metric: 'grad_norm', granularity: 'variable'}).granularity, 'variable');
  // A server without per-granularity metrics: every granularity holds every metric.
  const old = {...CHECK_RUN, granularities: {layer: {rows: ['a']}, variable: {rows: ['a/k']}}};
  assert.deepEqual(granularitiesWithMetric(old, 'check_error'), ['layer', 'variable']);
});

test('align_rows_puts_runs_on_the_union_of_their_rows', () => {
  assert.deepEqual(unionRows(['a', 'b', 'c'], ['b', 'x', 'a']), ['a', 'b', 'c', 'x']);
  const resp = {layers: ['b', 'x'], steps: [0, 1], values: [[1, 2], [3, 'NaN']], status: null};
  const out = alignRows(resp, ['a', 'b', 'c', 'x']);
  assert.deepEqual(out.layers, ['a', 'b', 'c', 'x']);
  assert.deepEqual(out.values, [[null, 1, null, 2], [null, 3, null, 'NaN']]);
  assert.deepEqual(out.absent, [true, false, true, false]);
  assert.deepEqual(resp.layers, ['b', 'x'], 'the response is not changed');
});

test('runs_changed_looks_only_at_the_shown_runs_last_write', () => {
  const before = [{run: 'a', last_write: 1, total_steps: 10}, {run: 'b', last_write: 5}];
  assert.equal(runsChanged(before, [{run: 'a', last_write: 1, total_steps: 10}, {run: 'b', last_write: 6}], ['a']), false);
  assert.equal(runsChanged(before, [{run: 'a', last_write: 2, total_steps: 10}, {run: 'b', last_write: 5}], ['a']), true);
  assert.equal(runsChanged(before, [{run: 'a', last_write: 1, total_steps: 10}, {run: 'b', last_write: 6}], ['a', 'b']), true);
  assert.equal(runsChanged(before, [{run: 'b', last_write: 5}], ['a', null]), true);
});

const VANISHING = {
  kind: 'vanishing', severity: 'warning', layers: ['m/d0', 'm/d1'], steps: [0, 99], metric: 'grad_norm', aggregate: 'last',
  message: 'Vanishing gradients in m/d0, m/d1.',
  evidence: {
    'm/d0': {median_norm: 4.8e-8, median_orders_below_later_layers: 6.6123, fraction_of_steps: 1, first_step: 0, last_step: 99, reason: 'decays across depth'},
    'm/d1': {median_norm: 1e-6, median_orders_below_later_layers: null, fraction_of_steps: 0.8, first_step: 20, last_step: 90, reason: 'below the floor'},
  },
};
const CHECK = {
  kind: 'check_failure', severity: 'error', layers: ['m/d1'], steps: [40, 50], metric: 'check_error', aggregate: 'last',
  message: 'Gradient check failed for m/d1.',
  evidence: {'m/d1': {max_relative_error: 0.034, checks_failed: 2, checks_run: 10, first_step: 40, last_step: 50}},
};

test('finding_cells_use_each_layers_own_steps_and_cover_variables', () => {
  assert.deepEqual(findingCells(VANISHING, ['m/d0', 'm/d1', 'm/out']), {rows: [0, 1], ranges: [[0, 99], [20, 90]]});
  const vars = ['m/d0/kernel', 'm/d0/bias', 'm/d1/kernel', 'm/d10/kernel'];
  assert.deepEqual(findingCells(VANISHING, vars).rows, [0, 1, 2]); // not m/d10: a prefix needs the slash
  const noEvidence = {...VANISHING, evidence: {}};
  assert.deepEqual(findingCells(noEvidence, ['m/d1']).ranges, [[0, 99]]);
  assert.deepEqual(findingCells(VANISHING, ['other']), {rows: [], ranges: []});
});

test('row_marks_keep_the_worst_severity_and_every_kind', () => {
  assert.deepEqual(rowMarks([VANISHING, CHECK], ['m/d0', 'm/d1']), [
    {row: 0, severity: 'warning', kinds: ['vanishing']},
    {row: 1, severity: 'error', kinds: ['vanishing', 'check_failure']},
  ]);
  assert.deepEqual(rowMarks(null, ['m/d0']), []);
});

test('findings_sort_errors_first_and_keys_are_stable', () => {
  assert.deepEqual(sortFindings([VANISHING, CHECK]).map((f) => f.kind), ['check_failure', 'vanishing']);
  assert.equal(findingKey(VANISHING), findingKey({...VANISHING, message: 'changed'}));
  assert.notEqual(findingKey(VANISHING), findingKey(CHECK));
});

test('evidence_reads_as_formatted_numbers', () => {
  const items = evidenceItems(VANISHING);
  assert.deepEqual(items.map((e) => e.layer), ['m/d0', 'm/d1']);
  const d0 = Object.fromEntries(items[0].items);
  assert.equal(d0.steps, '0\u201399');
  assert.equal(d0['median norm'], '4.8e-8');
  assert.equal(d0['orders below later layers (median)'], '6.61');
  assert.equal(d0['steps affected'], '100%');
  assert.equal(d0.reason, 'decays across depth');
  assert.equal(Object.fromEntries(items[1].items)['orders below later layers (median)'], '\u2014');
  assert.equal(Object.fromEntries(evidenceItems(CHECK)[0].items)['max relative error'], '3.4%');
});

test('layer_headlines_name_the_number_that_matters', () => {
  assert.equal(layerHeadline(CHECK, 'm/d1'), 'rel. error 3.4%');
  assert.equal(layerHeadline(VANISHING, 'm/d0'), '6.61 orders below');
  assert.equal(layerHeadline(VANISHING, 'm/d1'), 'median norm 1e-6');
  assert.equal(layerHeadline({kind: 'exploding', evidence: {a: {max_norm: 954761.6875}}}, 'a'), 'max norm 9.55e5');
  assert.equal(layerHeadline({kind: 'non_finite', evidence: {a: {steps_with_nonfinite: 1}}}, 'a'), '1 step');
  assert.equal(layerHeadline(CHECK, 'missing'), '');
});

test('format_number_and_step_ranges', () => {
  assert.equal(formatNumber(272), '272');
  assert.equal(formatNumber(12345678), '12,345,678');
  assert.equal(formatNumber(0.034), '0.034');
  assert.equal(formatNumber(842833.625), '8.43e5');
  assert.equal(formatNumber(null), '\u2014');
  assert.equal(formatNumber(NaN), 'NaN');
  assert.equal(stepRangeText([250, 250]), 'step 250');
  assert.equal(stepRangeText([0, 1999]), 'steps 0\u20131,999');
  assert.equal(stepRangeText(null), '');
});
