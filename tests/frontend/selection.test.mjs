// Unit tests of frontend/selection.js (node --test): choosing a valid
// selection and the status line.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {aggregatesOf, defaultAggregate, granularitiesWithMetric, metricChoices, reconcileSelection, runsChanged, statusParts} from '../../frontend/selection.js';

const RUNS = [
  {
    run: 'sigmoid',
    metrics: ['grad_norm', 'grad_max_abs', 'grad_nonfinite'],
    aggregates: {grad_norm: ['last'], grad_nonfinite: ['last']},
    window: 1,
    granularities: {
      layer: {rows: ['sequential/dense', 'sequential/dense_1'], num_steps: 300, first_step: 0, last_step: 299},
      variable: {rows: ['sequential/dense/kernel'], num_steps: 300, first_step: 0, last_step: 299},
    },
    total_steps: 300,
    sampled: false,
    problems: [],
  },
  {
    run: 'windowed',
    metrics: ['grad_max_abs', 'check_error'],
    aggregates: {grad_max_abs: ['last', 'mean', 'max', 'min']},
    window: 10,
    granularities: {layer: {rows: ['d'], num_steps: 100, first_step: 0, last_step: 990}},
    total_steps: 500,
    sampled: true,
    problems: [],
  },
];

const CHECK_RUN = {
  run: 'checked',
  metrics: ['grad_norm', 'check_error'],
  aggregates: {grad_norm: ['last']},
  granularities: {
    layer: {rows: ['m/d0', 'm/d1'], metrics: ['grad_norm', 'check_error']},
    variable: {rows: ['m/d0/kernel', 'm/d0/bias', 'm/d1/kernel'], metrics: ['grad_norm']},
  },
};

function resp(extra) {
  return {
    run: 'sigmoid', metric: 'grad_norm', granularity: 'layer', aggregate: 'last',
    layers: ['a', 'b', 'c'], steps: [0, 1, 2], step_ends: null, values: [], status: null,
    num_steps: 3, total_steps: 3, reduce: null, ...extra,
  };
}

test('reconcile_selection_keeps_what_is_still_valid', () => {
  const sel = reconcileSelection(RUNS, {run: 'sigmoid', metric: 'grad_max_abs', granularity: 'variable'});
  assert.deepEqual(sel, {run: 'sigmoid', metric: 'grad_max_abs', granularity: 'variable', aggregate: null});
  const kept = reconcileSelection(RUNS, {run: 'windowed', metric: 'grad_max_abs', aggregate: 'mean'});
  assert.equal(kept.aggregate, 'mean');
});

test('reconcile_selection_falls_back_per_field', () => {
  assert.deepEqual(reconcileSelection(RUNS, {}), {run: 'sigmoid', metric: 'grad_norm', granularity: 'layer', aggregate: 'last'});
  assert.deepEqual(
    reconcileSelection(RUNS, {run: 'gone', metric: 'weight_norm'}),
    {run: 'sigmoid', metric: 'grad_norm', granularity: 'layer', aggregate: 'last'},
  );
  assert.equal(reconcileSelection(RUNS, {run: 'windowed', metric: 'grad_max_abs', granularity: 'variable'}).granularity, 'layer');
  assert.equal(reconcileSelection([], {}), null);
});

test('a_windowed_run_opens_on_max', () => {
  // `last` of a window hides exactly the spike the window kept.
  const sel = reconcileSelection(RUNS, {run: 'windowed'});
  assert.deepEqual(sel, {run: 'windowed', metric: 'grad_max_abs', granularity: 'layer', aggregate: 'max'});
  // An aggregate the run lacks for this metric falls back to the default, not to `last`.
  assert.equal(reconcileSelection(RUNS, {run: 'windowed', metric: 'grad_max_abs', aggregate: 'sum'}).aggregate, 'max');
  assert.equal(defaultAggregate(['last']), 'last');
  assert.equal(defaultAggregate([]), null);
  assert.equal(defaultAggregate(['last', 'mean', 'max', 'min']), 'max');
});

test('the_preferred_run_opens_when_nothing_was_chosen_before', () => {
  assert.equal(reconcileSelection(RUNS, {}, 'windowed').run, 'windowed');
  assert.equal(reconcileSelection(RUNS, {run: 'sigmoid'}, 'windowed').run, 'sigmoid');
  assert.equal(reconcileSelection(RUNS, {}, 'gone').run, 'sigmoid');
});

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

test('aggregates_of_a_metric_without_list_is_empty', () => {
  assert.deepEqual(aggregatesOf(RUNS[1], 'check_error'), []);
  assert.deepEqual(aggregatesOf(RUNS[1], 'grad_max_abs'), ['last', 'mean', 'max', 'min']);
});

test('the_metric_picker_offers_the_servers_metrics_in_its_order_but_not_tracks', () => {
  const mixed = {run: 'amp', metrics: ['grad_norm', 'loss_scale', 'refused_steps', 'check_error', 'act_mean_abs']};
  assert.deepEqual(metricChoices(mixed), [
    {value: 'grad_norm', label: 'gradient norm (grad_norm)'},
    {value: 'check_error', label: 'gradient check error (check_error)'},
    // A metric the tab has no label for yet is still offered, under its name.
    {value: 'act_mean_abs', label: 'act mean abs (act_mean_abs)'},
  ]);
  assert.deepEqual(metricChoices(null), []);
  assert.deepEqual(metricChoices({run: 'old'}), []);
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

test('status_line_counts_steps_and_rows', () => {
  const parts = statusParts(RUNS[0], resp(), {rows: 3, shownRows: 3, pixelRows: 3});
  assert.deepEqual(parts.map((p) => p.text), ['3 steps (0\u20132)', '3 layers']);
  const one = statusParts(RUNS[0], resp({layers: ['kernel'], granularity: 'variable', steps: [5], num_steps: 1}), null);
  assert.deepEqual(one.map((p) => p.text), ['1 step', '1 variable']);
});

test('status_line_says_sampled_binned_and_rows_in_pixels', () => {
  const r = resp({steps: [0, 500], step_ends: [499, 990], num_steps: 100, total_steps: 500, reduce: 'max', aggregate: 'max'});
  const text = statusParts(RUNS[1], r, {rows: 2000, shownRows: 2000, pixelRows: 600}).map((p) => p.text).join(' | ');
  assert.match(text, /showing 100 of 500 steps \(TensorBoard sampled this series; start it with --samples_per_plugin gradients=0 to keep all\)/);
  assert.match(text, /2 columns \(max per bin\)/);
  assert.match(text, /written every 10 training steps, max of each window/);
  assert.match(text, /2,000 layers/);
  assert.match(text, /2,000 rows in 600 pixel rows \(max per bin\)/);
  // Cut by the data server's per-read limit, not by TensorBoard's sampling:
  // the sampling flag would be the wrong advice.
  const capped = statusParts({...RUNS[1], capped: true}, r, null).map((p) => p.text).join(' | ');
  assert.match(capped, /showing 100 of 500 steps \(a uniform sample: the run is larger than one read/);
  assert.doesNotMatch(capped, /samples_per_plugin/);
});

test('activation_metrics_are_offered_under_their_labels_at_layer_granularity_only', () => {
  // What GET runs lists for a run written with activations=True: the act_ metrics at the layer granularity only.
  const run = {
    run: 'acts',
    metrics: ['grad_norm', 'act_rms', 'act_saturated_fraction'],
    aggregates: {grad_norm: ['last'], act_rms: ['last'], act_saturated_fraction: ['last']},
    granularities: {
      layer: {rows: ['0', '2'], metrics: ['grad_norm', 'act_rms', 'act_saturated_fraction']},
      variable: {rows: ['0.weight'], metrics: ['grad_norm']},
    },
  };
  assert.deepEqual(metricChoices(run).map((c) => c.label), [
    'gradient norm (grad_norm)',
    'activation RMS (act_rms)',
    'saturated (tanh/sigmoid) (act_saturated_fraction)',
  ]);
  assert.deepEqual(granularitiesWithMetric(run, 'act_rms'), ['layer']);
  const sel = reconcileSelection([run], {run: 'acts', metric: 'act_rms', granularity: 'variable'});
  assert.equal(sel.granularity, 'layer');
});
