// Unit tests of frontend/state.js (node --test): the tab's state declared
// once, and the named functions that change it.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  activeFinding, compareMode, createState, currentScale, dropGrids, keepFindings, replan, runInfo, showFindingsOf,
  takeAnswers, takeFindings, takeFindingsError, takeRuns, takeView,
} from '../../frontend/state.js';
import {RUNS} from './runs.mjs';

const BLOCKS = ['t/block_0/q', 't/block_0/k', 't/block_1/q', 't/block_1/k', 't/head'];

test('a_new_state_declares_every_field_and_keeps_only_a_valid_saved_scale', () => {
  const st = createState();
  assert.deepEqual(Object.keys(st), [
    'runs', 'sel', 'scales', 'compare', 'alignment', 'onlyIn', 'otherNames', 'main', 'other', 'names', 'display', 'groups', 'rows',
    'plan', 'checks', 'findings', 'findingsByRun', 'activeKey', 'painted', 'timing', 'loads', 'polls',
  ]);
  assert.deepEqual(st.main, {run: null, resp: null, grid: null, axis: null});
  assert.notEqual(st.main, st.other);
  // Magnitudes open on log, fractions on linear; a saved choice of each is kept, anything else is not.
  assert.deepEqual(st.scales, {magnitude: 'log', fraction: 'linear'});
  assert.deepEqual(createState({scale: 'linear', fractionScale: 'log'}).scales, {magnitude: 'linear', fraction: 'log'});
  assert.deepEqual(createState({scale: 'sideways', fractionScale: 7}).scales, {magnitude: 'log', fraction: 'linear'});
  assert.equal(currentScale(st), 'log'); // nothing selected yet: a magnitude
  // Two tabs never share a set or a map.
  assert.notEqual(createState().rows.collapsed, st.rows.collapsed);
  assert.notEqual(createState().findingsByRun, st.findingsByRun);
});

test('take_runs_reconciles_the_selection_and_says_whether_it_changed', () => {
  const st = createState();
  assert.equal(takeRuns(st, RUNS, {run: 'checked', metric: 'grad_norm'}), true);
  assert.deepEqual(st.sel, {run: 'checked', metric: 'grad_norm', granularity: 'layer', aggregate: 'max'});
  assert.equal(runInfo(st), RUNS[1]);
  assert.equal(runInfo(st, 'sigmoid'), RUNS[0]);
  assert.equal(runInfo(st, 'gone'), null);
  // The same list again: nothing changes.
  assert.equal(takeRuns(st, RUNS.map((r) => ({...r}))), false);
  // The selected run is gone: the first run opens, on its defaults.
  assert.equal(takeRuns(st, [RUNS[0]]), true);
  assert.equal(st.sel.run, 'sigmoid');
  // No run left: no selection.
  assert.equal(takeRuns(st, []), true);
  assert.equal(st.sel, null);
  assert.equal(runInfo(st), null);
});

test('the_compare_mode_needs_another_run_that_exists_and_a_check_has_no_ratio', () => {
  const st = createState();
  takeRuns(st, RUNS, {run: 'sigmoid'});
  assert.equal(compareMode(st), null);
  st.compare.other = 'checked';
  assert.equal(compareMode(st), 'side');
  st.compare.mode = 'ratio';
  assert.equal(compareMode(st), 'ratio');
  st.compare.other = 'sigmoid';
  assert.equal(compareMode(st), null);
  st.compare.other = 'gone';
  assert.equal(compareMode(st), null);
  takeRuns(st, RUNS, {run: 'checked', metric: 'check_error'});
  st.compare.other = 'sigmoid';
  assert.equal(compareMode(st), 'side');
});

test('take_view_regroups_rows_only_when_their_names_change', () => {
  const st = createState();
  const pane = (run, layers) => ({run, resp: {layers}, grid: {rows: layers.length}, axis: null});
  const view = (names) => ({main: pane('a', names), other: pane(null, []), names, otherNames: null, onlyIn: [[], []]});
  takeView(st, view(BLOCKS));
  assert.deepEqual(st.groups.map((g) => g.key), ['t/block_0/', 't/block_1/']);
  assert.equal(st.plan.labels.length, 5);
  st.rows.collapsed = new Set(['t/block_0/']);
  st.rows.zoom = {rows: [1, 4], steps: null};
  replan(st);
  assert.deepEqual(st.plan.labels, ['t/block_0/ (1)', 't/block_1/q', 't/block_1/k', 't/head']);
  // New steps, same rows: the collapsed block and the zoom stay.
  const groups = st.groups;
  takeView(st, view([...BLOCKS]));
  assert.equal(st.groups, groups);
  assert.deepEqual(st.plan.labels, ['t/block_0/ (1)', 't/block_1/q', 't/block_1/k', 't/head']);
  // Fewer rows: the zoom past them goes, a collapsed group that is gone too.
  takeView(st, view(['t/block_1/q', 't/block_1/k', 't/head']));
  assert.equal(st.rows.zoom, null);
  assert.deepEqual([...st.rows.collapsed], []);
  assert.deepEqual(st.plan.labels, ['t/block_1/q', 't/block_1/k', 't/head']);
  assert.equal(st.main.run, 'a');
});

test('take_answers_keeps_the_alignment_and_checks_beside_the_matrices', () => {
  const st = createState();
  const aligned = {alignment: 'name', basis: 'names', matched: 1, run_layers: ['a', 'b'], other_layers: ['a', null],
    only_in_run: ['b'], only_in_other: []};
  takeAnswers(st, {aligned, checks: {step: 40, rows: []}});
  assert.deepEqual(st.alignment, {mode: 'name', basis: 'names', matched: 1, total: 2, roots: ['', '']});
  assert.deepEqual(st.checks, {step: 40, rows: []});
  takeAnswers(st, {aligned: null, checks: null});
  assert.equal(st.alignment, null);
  assert.equal(st.checks, null);
});

test('drop_grids_forgets_what_was_drawn_and_a_failure_the_answer_too', () => {
  const st = createState();
  st.main = {run: 'a', resp: {layers: []}, grid: {}, axis: {first: 0, end: 3}};
  st.other.grid = {};
  st.painted.drawn = true;
  dropGrids(st);
  assert.equal(st.main.grid, null);
  assert.equal(st.other.grid, null);
  assert.equal(st.painted.drawn, false);
  assert.deepEqual(st.main.resp, {layers: []});
  dropGrids(st, true);
  assert.equal(st.main.resp, null);
  assert.deepEqual(st.main.axis, {first: 0, end: 3}); // the hook still says which steps were last shown
});

test('findings_of_another_run_replace_the_panel_and_a_late_answer_is_dropped', () => {
  const st = createState();
  const vanishing = {kind: 'vanishing', severity: 'warning', layers: ['mlp/dense_0']};
  keepFindings(st, 'sigmoid', [vanishing]);
  showFindingsOf(st, 'checked');
  assert.deepEqual(st.findings, {run: 'checked', list: null, error: null});
  st.activeKey = 'x';
  showFindingsOf(st, 'checked'); // the same run: the spotlight stays
  assert.equal(st.activeKey, 'x');
  showFindingsOf(st, 'sigmoid'); // a known run shows its list at once
  assert.deepEqual(st.findings.list, [vanishing]);
  assert.equal(st.activeKey, null);
  // The answer for `checked` arrives after the panel moved on: dropped.
  assert.equal(takeFindings(st, 'checked', []), false);
  assert.equal(takeFindingsError(st, 'checked', 'Could not load findings: 500'), false);
  assert.deepEqual(st.findings.list, [vanishing]);
  assert.equal(takeFindingsError(st, 'sigmoid', 'Could not load findings: 500'), true);
  assert.deepEqual(st.findings, {run: 'sigmoid', list: [vanishing], error: 'Could not load findings: 500'});
  assert.equal(takeFindings(st, 'sigmoid', []), true);
  assert.deepEqual(st.findings, {run: 'sigmoid', list: [], error: null});
});

test('the_active_finding_is_found_by_its_key', () => {
  const st = createState();
  const f = {kind: 'vanishing', severity: 'warning', layers: ['mlp/dense_0', 'mlp/dense_1']};
  st.findings = {run: 'sigmoid', list: [f], error: null};
  assert.equal(activeFinding(st), null);
  st.activeKey = 'vanishing:mlp/dense_0\u0000mlp/dense_1';
  assert.equal(activeFinding(st), f);
  st.activeKey = 'vanishing:mlp/dense_0';
  assert.equal(activeFinding(st), null);
});
