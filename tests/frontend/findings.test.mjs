// Unit tests of frontend/findings.js (node --test).
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  evidenceItems, findingCells, findingKey, kindLabel, layerHeadline, rowMarks, runNeedingAttention, severityClass, sortFindings, worstSeverity,
} from '../../frontend/findings.js';

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
  assert.equal(layerHeadline({kind: 'non_finite', evidence: {a: {writes_with_nonfinite: 1}}}, 'a'), '1 write');
  assert.equal(layerHeadline(CHECK, 'missing'), '');
});

test('the_tab_opens_on_the_run_with_the_most_severe_findings', () => {
  const warn = {kind: 'vanishing', severity: 'warning', layers: ['a']};
  const err = {kind: 'check_failure', severity: 'error', layers: ['b']};
  const runs = ['a_healthy', 'b_vanishing', 'c_wrong', 'd_two_warnings'];
  const found = new Map([['a_healthy', []], ['b_vanishing', [warn]], ['c_wrong', [err]], ['d_two_warnings', [warn, warn]]]);
  assert.equal(runNeedingAttention(runs, found), 'c_wrong');
  found.delete('c_wrong');
  assert.equal(runNeedingAttention(runs, found), 'd_two_warnings');
  assert.equal(runNeedingAttention(runs, new Map()), 'a_healthy');
  assert.equal(worstSeverity([warn, err]), 'error');
  assert.equal(worstSeverity([]), null);
});

test('finding_cells_of_a_1000_layer_finding_are_found_by_lookup', () => {
  const rows = Array.from({length: 2000}, (_, i) => `t/block_${Math.floor(i / 8)}/w${i % 8}`);
  const f = {kind: 'vanishing', severity: 'warning', layers: rows.slice(0, 1030), steps: [0, 9]};
  const cells = findingCells(f, rows);
  assert.equal(cells.rows.length, 1030);
  assert.equal(cells.rows[1029], 1029);
  const blockLevel = findingCells({...f, layers: ['t/block_3']}, rows);
  assert.deepEqual(blockLevel.rows, [24, 25, 26, 27, 28, 29, 30, 31]);
});

test('information_is_shown_last_marks_no_row_and_needs_no_attention', () => {
  const info = {kind: 'dead', severity: 'info', layers: ['a'], evidence: {a: {state: 'idle', median_dead_unit_fraction: 0.45}}};
  const warn = {kind: 'vanishing', severity: 'warning', layers: ['b']};
  assert.deepEqual(sortFindings([info, warn]).map((f) => f.severity), ['warning', 'info']);
  assert.equal(worstSeverity([info]), 'info');
  assert.equal(worstSeverity([info, warn]), 'warning');
  assert.equal(severityClass('info'), 'info');
  assert.equal(severityClass('something new'), 'warning');
  assert.deepEqual(rowMarks([info], ['a', 'b']), []);
  assert.equal(layerHeadline(info, 'a'), '45% idle');
  // A run with information only is as healthy as one without findings.
  const found = new Map([['a_healthy', []], ['b_idle', [info]], ['c_idle', [info, info]]]);
  assert.equal(runNeedingAttention(['a_healthy', 'b_idle', 'c_idle'], found), 'a_healthy');
  found.set('d_vanishing', [warn]);
  assert.equal(runNeedingAttention(['a_healthy', 'b_idle', 'c_idle', 'd_vanishing'], found), 'd_vanishing');
});

test('kindLabel: dead units that are information are not called dead; unknown kinds read as words', () => {
  assert.equal(kindLabel({kind: 'dead', severity: 'warning'}), 'Dead units');
  assert.equal(kindLabel({kind: 'dead', severity: 'info'}), 'Units without gradient (information)');
  assert.equal(kindLabel(VANISHING), 'Vanishing gradients');
  assert.equal(kindLabel({kind: 'not_learning', severity: 'warning'}), 'Not learning');
  assert.equal(kindLabel({kind: 'some_new_kind', severity: 'warning'}), 'some new kind');
});

test('forward_side_findings_read_with_their_own_headings_headlines_and_evidence', () => {
  const f = {
    kind: 'saturated', severity: 'warning', layers: ['0'],
    evidence: {'0': {first_step: 4, last_step: 29, max_saturated_fraction: 0.804, fraction_of_steps: 0.87}},
  };
  assert.equal(kindLabel(f), 'Saturated tanh/sigmoid');
  assert.equal(layerHeadline(f, '0'), '80.4% saturated');
  assert.deepEqual(evidenceItems(f)[0].items, [['steps', '4\u201329'], ['saturated outputs (max)', '80.4%'], ['steps affected', '87%']]);
  const dead = {kind: 'dead', severity: 'warning', layers: ['2'], evidence: {'2': {dead_by_output: 0, views_disagree: true}}};
  assert.deepEqual(evidenceItems(dead)[0].items, [['dead by output (median)', '0%'], ['gradient and output views disagree', 'yes']]);
  const massive = {kind: 'massive_activations', severity: 'info', layers: ['a'], evidence: {a: {max_abs_activation: 1e4}}};
  assert.equal(kindLabel(massive), 'Massive activations');
  assert.equal(layerHeadline(massive, 'a'), '|a| 10,000');
  const growth = {kind: 'activation_growth', severity: 'warning', layers: ['a'], evidence: {a: {max_growth_orders: 2.26}}};
  assert.equal(layerHeadline(growth, 'a'), '+2.26 orders');
});
