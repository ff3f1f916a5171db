// Unit tests of frontend/format.js (node --test): numbers, values, names.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {allZeroText, compactNames, formatNumber, formatValue, metricLabel, plural, ratioMetricEnds, stepRangeText} from '../../frontend/format.js';

test('format_value_is_exact_for_float32', () => {
  assert.equal(formatValue(Math.fround(1.2e-7)), '1.2e-7');
  assert.equal(formatValue(Math.fround(0.0031)), '0.0031');
  assert.equal(formatValue(Math.fround(1 / 3)), '0.33333334');
  assert.equal(formatValue(Math.fround(3.4028234663852886e38)), '3.4028235e38');
  assert.equal(formatValue(Math.fround(123456)), '123456');
  assert.equal(formatValue(Math.fround(-2.5e-12)), '-2.5e-12');
  assert.equal(formatValue(1 / 3), '0.3333333', 'a float64 value gets 7 digits');
  // Each shown string reads back as the same float32.
  for (const v of [1.2345678e-9, 0.1, 7.654321, 98765.43, 1e-45]) {
    const f = Math.fround(v);
    assert.equal(Math.fround(Number(formatValue(f))), f, `${v}`);
  }
});

test('format_value_names_special_values', () => {
  assert.equal(formatValue(null), 'missing (no gradient)');
  assert.equal(formatValue(null, 'grad_norm'), 'missing (no gradient)');
  // An activation metric's missing cell is a layer without that output statistic, not a missing gradient.
  assert.equal(formatValue(null, 'act_dead_fraction'), 'missing (not recorded for this layer)');
  assert.equal(formatValue(0.5, 'act_rms'), '0.5');
  assert.equal(formatValue(NaN), 'NaN');
  assert.equal(formatValue(Infinity), 'Infinity');
  assert.equal(formatValue(-Infinity), '-Infinity');
  assert.equal(formatValue(0), '0');
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

test('metric_labels_come_from_the_id_for_metrics_the_tab_does_not_know', () => {
  assert.equal(metricLabel('grad_norm'), 'gradient norm (grad_norm)');
  assert.equal(metricLabel('dead_unit_fraction'), 'dead unit fraction (dead_unit_fraction)');
  assert.equal(metricLabel('some_new_column'), 'some new column (some_new_column)');
  assert.equal(metricLabel('plain'), 'plain');
});

test('long_layer_sets_are_named_by_their_ends_and_count', () => {
  const names = [];
  for (let b = 3; b <= 47; b++) for (let k = 0; k < 23; k++) names.push(`transformer/block_${String(b).padStart(2, '0')}/w${k}`);
  names.length = 1030;
  assert.equal(compactNames(names), 'transformer/block_03 \u2026 block_47, 1,030 layers');
  assert.equal(compactNames(['a', 'b']), 'a, b');
  const plain = Array.from({length: 9}, (_, i) => `mlp/dense_${i}`);
  assert.equal(compactNames(plain, 'variable'), 'mlp/dense_0 \u2026 dense_8, 9 variables');
  assert.equal(plural(1, 'step'), '1 step');
});

test('all_zero_text_says_what_zero_means', () => {
  assert.match(allZeroText('grad_nonfinite'), /is 0 at every step and row shown: no NaN or Inf/);
  assert.match(allZeroText('weight_norm'), /^weight_norm is 0 at every step and row shown\.$/);
});

test('only ratio metrics get the diverging scale, with both ends named', () => {
  const ends = ratioMetricEnds('clip_ratio');
  assert.ok(ends.low && ends.high && ends.low !== ends.high);
  assert.match(ends.high, /clipped/);
  for (const m of ['grad_norm', 'grad_norm_before_clip', 'grad_to_weight', 'update_to_weight', 'no_such']) {
    assert.equal(ratioMetricEnds(m), null, m);
  }
  assert.equal(metricLabel('clip_ratio'), 'before-clip / applied norm (clip_ratio)');
});

test('activation_metrics_have_labels_and_all_zero_sentences', () => {
  assert.equal(metricLabel('act_max_abs'), 'max |activation| (act_max_abs)');
  assert.equal(metricLabel('act_dead_fraction'), 'dead by output (ReLU) (act_dead_fraction)');
  assert.match(allZeroText('act_saturated_fraction'), /no tanh or sigmoid output near its bounds/);
  assert.match(allZeroText('act_nonfinite'), /no NaN or Inf in any layer output/);
});
