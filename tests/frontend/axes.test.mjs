// Unit tests of frontend/axes.js (node --test): ticks and the step-linear x axis.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  columnOfStep, columnRange, formatTicks, linearTicks, logTicks, pixelColumns, stepAxis, stepTicks, stepX,
} from '../../frontend/axes.js';
import {ratioTickLabel} from '../../frontend/views.js';

test('log_ticks_are_powers_of_ten', () => {
  assert.deepEqual(logTicks(1e-8, 1, 9), [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1]);
  assert.deepEqual(logTicks(3e-9, 2, 9), [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1]);
});

test('log_ticks_thin_many_decades', () => {
  const t = logTicks(1e-30, 1e2, 7);
  assert.ok(t.length <= 7 && t.length >= 2);
  for (const v of t) assert.ok(Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-12, `${v}`);
});

test('log_ticks_narrow_range_uses_1_2_5', () => {
  assert.deepEqual(logTicks(0.15, 0.9), [0.2, 0.5]);
  assert.deepEqual(logTicks(0.04, 3, 7), [0.05, 0.1, 0.2, 0.5, 1, 2]);
  // Too many 1-2-5 ticks for maxTicks: decades instead.
  assert.deepEqual(logTicks(0.0011, 3, 5), [0.01, 0.1, 1]);
  const t = logTicks(0.31, 0.34);
  assert.ok(t.length >= 1 && t.every((v) => v >= 0.31 && v <= 0.34));
});

test('linear_ticks_are_nice_numbers', () => {
  assert.deepEqual(linearTicks(0, 1, 5), [0, 0.2, 0.4, 0.6, 0.8, 1]);
  assert.deepEqual(linearTicks(0, 0.3, 3), [0, 0.1, 0.2, 0.3]);
  assert.deepEqual(linearTicks(-3, 7, 5), [-2, 0, 2, 4, 6]);
  assert.deepEqual(linearTicks(13, 1000, 4), [200, 400, 600, 800, 1000]);
});

test('tick_labels_share_one_notation', () => {
  assert.deepEqual(formatTicks([1e-8, 1e-6, 1e-4, 1e-2, 1]), ['1e-8', '1e-6', '1e-4', '1e-2', '1e0']);
  assert.deepEqual(formatTicks([0, 0.5, 1]), ['0', '0.5', '1']);
  assert.deepEqual(formatTicks([0.001, 0.01, 0.1]), ['0.001', '0.01', '0.1']);
  assert.deepEqual(formatTicks([2e5, 4e5]), ['2e5', '4e5']);
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

test('step_axis_is_linear_in_steps_when_sampled', () => {
  // TensorBoard kept steps 0, 10, 11, 12 and 40 of 0..49: step 10 sits a
  // fifth of the way along, not at the second of five equal columns.
  const axis = stepAxis([0, 10, 11, 12, 40], null);
  assert.equal(axis.first, 0);
  assert.equal(axis.end, 41);
  assert.deepEqual(Array.from(axis.edges).map((e) => Number(e.toFixed(4))), [0, 0.2439, 0.2683, 0.2927, 0.9756, 1]);
  assert.ok(Math.abs(stepX(axis, 10) - 10.5 / 41) < 1e-12);
  const ticks = stepTicks(axis, 4);
  assert.deepEqual(ticks.map((t) => t.step), [0, 10, 20, 30, 40]);
  // Equal steps, equal distances.
  assert.ok(Math.abs((ticks[1].x - ticks[0].x) - (ticks[4].x - ticks[3].x)) < 1e-12);
});

test('step_axis_of_server_bins_spans_each_bins_steps', () => {
  const axis = stepAxis([0, 100, 200], [99, 199, 299]);
  assert.deepEqual(Array.from(axis.edges), [0, 1 / 3, 2 / 3, 1]);
  assert.deepEqual(stepTicks(stepAxis([7], null)), [{step: 7, x: 0.5}]);
  // Checks every 10 steps: the last column is 10 steps wide like the others.
  assert.deepEqual(Array.from(stepAxis([0, 10, 20, 30], null).edges), [0, 0.25, 0.5, 0.75, 1]);
});

test('pixel_columns_cover_every_column_and_repeat_wide_ones', () => {
  // 3 equal columns on 6 pixels: two pixels each.
  const wide = pixelColumns(stepAxis([0, 1, 2], null).edges, 6);
  assert.deepEqual(Array.from(wide.start), [0, 0, 1, 1, 2, 2]);
  assert.deepEqual(Array.from(wide.end), [0, 0, 1, 1, 2, 2]);
  // 10 columns on 3 pixels: every column falls in some pixel.
  const narrow = pixelColumns(stepAxis([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], null).edges, 3);
  const seen = new Set();
  for (let x = 0; x < 3; x++) for (let c = narrow.start[x]; c <= narrow.end[x]; c++) seen.add(c);
  assert.equal(seen.size, 10);
  assert.equal(narrow.start[0], 0);
  assert.equal(narrow.end[2], 9);
});

test('a_shared_axis_leaves_pixels_past_a_shorter_run_empty', () => {
  const axis = stepAxis([0, 1, 2, 3], null, {first: 0, end: 8});
  assert.deepEqual(Array.from(axis.edges), [0, 0.125, 0.25, 0.375, 0.5]);
  const px = pixelColumns(axis.edges, 8);
  assert.deepEqual(Array.from(px.start), [0, 1, 2, 3, -1, -1, -1, -1]);
});

test('column_of_step_is_the_last_column_starting_at_or_before', () => {
  assert.equal(columnOfStep([0, 10, 20], 15), 1);
  assert.equal(columnOfStep([0, 10, 20], -1), -1);
  assert.equal(columnOfStep([0, 10, 20], 25), 2);
});
