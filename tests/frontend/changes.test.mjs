// Unit tests of frontend/changes.js (node --test): what each action changes
// in the tab's state, and whether a request or only a redraw follows.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  changeRows, changeSelection, clearFinding, compareWith, pollRuns, setAlign, setCompareMode, setScale, settleCompare,
  toggleFinding, zoomTo,
} from '../../frontend/changes.js';
import {findingKey} from '../../frontend/findings.js';
import {createState, currentScale, takeRuns, takeView} from '../../frontend/state.js';
import {RUNS} from './runs.mjs';

const ROWS = ['t/block_0/q', 't/block_0/k', 't/block_1/q', 't/block_1/k', 't/head'];

// A tab showing `run` with ROWS drawn.
function showing(run, prev = {}) {
  const st = createState();
  takeRuns(st, RUNS, {run, ...prev});
  const pane = {run, resp: {layers: ROWS}, grid: {rows: ROWS.length}, axis: null};
  takeView(st, {main: pane, other: {run: null, resp: null, grid: null, axis: null}, names: ROWS, otherNames: null, onlyIn: [[], []]});
  return st;
}

test('another_run_opens_on_its_own_default_aggregate_and_drops_the_zoom', () => {
  const st = showing('sigmoid');
  st.rows.zoom = {rows: [0, 2], steps: [10, 20]};
  assert.deepEqual(changeSelection(st, {run: 'checked'}), {runChanged: true});
  // checked is windowed: max, not sigmoid's last.
  assert.deepEqual(st.sel, {run: 'checked', metric: 'grad_norm', granularity: 'layer', aggregate: 'max'});
  assert.equal(st.rows.zoom, null);
  // An aggregate of the same run and metric keeps the zoom: same rows, same steps.
  st.rows.zoom = {rows: [0, 2], steps: [10, 20]};
  assert.deepEqual(changeSelection(st, {aggregate: 'last'}), {runChanged: false});
  assert.equal(st.sel.aggregate, 'last');
  assert.deepEqual(st.rows.zoom, {rows: [0, 2], steps: [10, 20]});
  // Another metric: the zoom goes; an aggregate the new metric has too is kept.
  changeSelection(st, {metric: 'grad_nonfinite'});
  assert.equal(st.rows.zoom, null);
  assert.equal(st.sel.aggregate, 'last');
  // A metric the run lacks falls back to grad_norm.
  changeSelection(st, {metric: 'weight_norm'});
  assert.equal(st.sel.metric, 'grad_norm');
});

test('settling_the_comparison_drops_a_run_that_is_the_selected_one_or_gone', () => {
  const st = showing('sigmoid');
  compareWith(st, 'checked');
  st.alignment = {mode: 'name'};
  assert.equal(settleCompare(st), 'side');
  assert.deepEqual(st.alignment, {mode: 'name'}); // the server's, kept until the next answer
  changeSelection(st, {run: 'checked'});
  assert.equal(settleCompare(st), null);
  assert.equal(st.compare.other, null);
  assert.equal(st.alignment, null);
  compareWith(st, 'gone');
  assert.equal(settleCompare(st), null);
  assert.equal(st.compare.other, null);
});

test('choosing_a_run_to_compare_gives_the_alignment_back_to_the_server', () => {
  const st = showing('sigmoid');
  st.compare.align = 'name';
  compareWith(st, 'checked');
  assert.deepEqual(st.compare, {other: 'checked', mode: 'side', align: null});
  compareWith(st, '');
  assert.equal(st.compare.other, null);
});

test('mode_align_and_scale_change_only_when_they_differ', () => {
  const st = showing('sigmoid');
  assert.equal(setCompareMode(st, 'side'), false);
  assert.equal(setCompareMode(st, 'ratio'), true);
  assert.equal(st.compare.mode, 'ratio');
  st.alignment = {mode: 'structure'};
  assert.equal(setAlign(st, 'structure'), false); // already shown that way
  assert.equal(setAlign(st, 'name'), true);
  assert.equal(st.compare.align, 'name');
  assert.equal(setScale(st, 'log'), false);
  assert.equal(setScale(st, 'linear'), true);
  assert.equal(currentScale(st), 'linear');
  assert.equal(setScale(st, null), false);
});

test('fractions_and_magnitudes_keep_a_scale_each_and_a_metric_opens_on_its_own', () => {
  const st = createState();
  const sigmoid = RUNS[0];
  const withFraction = {
    ...sigmoid, metrics: [...sigmoid.metrics, 'grad_zero_fraction'],
    aggregates: {...sigmoid.aggregates, grad_zero_fraction: ['last']},
  };
  takeRuns(st, [withFraction, RUNS[1]], {run: 'sigmoid'});
  assert.equal(st.sel.metric, 'grad_norm');
  assert.equal(currentScale(st), 'log');
  changeSelection(st, {metric: 'grad_zero_fraction'});
  assert.equal(currentScale(st), 'linear'); // a share of [0, 1]: 0 is a colour, not the black "<= 0"
  assert.equal(setScale(st, 'log'), true); // the user's choice for fractions
  changeSelection(st, {metric: 'grad_max_abs'});
  assert.equal(currentScale(st), 'log'); // magnitudes keep theirs
  assert.equal(setScale(st, 'linear'), true);
  changeSelection(st, {metric: 'grad_zero_fraction'});
  assert.equal(currentScale(st), 'log'); // and fractions theirs
  assert.deepEqual(st.scales, {magnitude: 'linear', fraction: 'log'});
});

test('row_changes_replan_the_display_rows', () => {
  const st = showing('sigmoid');
  changeRows(st, {collapseAll: true});
  assert.deepEqual(st.plan.labels, ['t/block_0/ (2)', 't/block_1/ (2)', 't/head']);
  changeRows(st, {toggleGroup: 't/block_1/'});
  assert.deepEqual(st.plan.labels, ['t/block_0/ (2)', 't/block_1/q', 't/block_1/k', 't/head']);
  changeRows(st, {toggleGroup: 't/block_1/'});
  assert.deepEqual([...st.rows.collapsed].sort(), ['t/block_0/', 't/block_1/']);
  changeRows(st, {expandAll: true, filter: 'HEAD'});
  assert.deepEqual(st.plan.labels, ['t/head']);
  changeRows(st, {filter: ''});
  assert.equal(st.plan.labels.length, 5);
});

test('a_zoom_asks_the_server_only_when_its_steps_change', () => {
  const st = showing('sigmoid');
  assert.equal(zoomTo(st, {rows: [1, 3], steps: [10, 50]}), 'load');
  assert.deepEqual(st.plan.labels, ['t/block_0/k', 't/block_1/q', 't/block_1/k']);
  assert.equal(zoomTo(st, {rows: [0, 1], steps: [10, 50]}), 'draw');
  assert.equal(zoomTo(st, null), 'load');
  assert.equal(st.plan.labels.length, 5);
  // A box over rows of an unbinned view carries no steps: no request.
  assert.equal(zoomTo(st, {rows: [2, 4], steps: null}), 'draw');
});

test('a_finding_clicked_clears_what_hides_its_rows_and_selects_its_metric', () => {
  const st = showing('checked', {metric: 'grad_norm', aggregate: 'last'});
  const nan = {kind: 'nonfinite', severity: 'error', layers: ['t/head'], metric: 'grad_nonfinite', aggregate: 'max', steps: [17, 17]};
  const vanishing = {kind: 'vanishing', severity: 'warning', layers: ['t/block_0/q'], metric: 'grad_norm', aggregate: 'last'};
  st.findings = {run: 'checked', list: [nan, vanishing], error: null};
  changeRows(st, {filter: 'block'});
  st.rows.zoom = {rows: [0, 1], steps: null};
  const t = toggleFinding(st, findingKey(nan));
  assert.deepEqual(t, {action: 'spotlight', clearedFilter: true, select: {metric: 'grad_nonfinite', aggregate: 'max'}});
  assert.equal(st.activeKey, findingKey(nan));
  assert.equal(st.rows.filter, '');
  assert.equal(st.rows.zoom, null);
  assert.equal(st.plan.labels.length, 5);
  // Its metric and aggregate already shown: a redraw.
  assert.deepEqual(toggleFinding(st, findingKey(vanishing)), {action: 'spotlight', clearedFilter: false, select: null});
  // Clicked again: cleared; an unknown key: nothing.
  assert.deepEqual(toggleFinding(st, findingKey(vanishing)), {action: 'clear'});
  assert.equal(clearFinding(st), true);
  assert.equal(st.activeKey, null);
  assert.equal(clearFinding(st), false);
  assert.deepEqual(toggleFinding(st, 'gone:x'), {action: 'none'});
});

test('a_finding_on_a_metric_the_run_lacks_keeps_the_selection', () => {
  const st = showing('sigmoid');
  const check = {kind: 'check_failure', severity: 'error', layers: ['t/head'], metric: 'check_error', aggregate: 'last'};
  st.findings = {run: 'sigmoid', list: [check], error: null};
  assert.deepEqual(toggleFinding(st, findingKey(check)), {action: 'spotlight', clearedFilter: false, select: null});
});

test('a_poll_reloads_only_when_a_shown_run_wrote_or_the_selection_moved', () => {
  const st = showing('sigmoid');
  const same = RUNS.map((r) => ({...r}));
  assert.deepEqual(pollRuns(st, same), {empty: false, controls: false, reload: false});
  // The run not shown wrote: nothing to reload.
  const otherWrote = [RUNS[0], {...RUNS[1], last_write: 21}];
  assert.deepEqual(pollRuns(st, otherWrote), {empty: false, controls: false, reload: false});
  // ...unless it is compared.
  compareWith(st, 'checked');
  const wrote = [RUNS[0], {...RUNS[1], last_write: 22}];
  assert.deepEqual(pollRuns(st, wrote), {empty: false, controls: true, reload: true});
  // A new run: the controls list it, the view stays.
  const grown = [...wrote, {...RUNS[0], run: 'zzz_new'}];
  assert.deepEqual(pollRuns(st, grown), {empty: false, controls: true, reload: false});
  assert.equal(st.runs, grown);
  // The selected run is gone: another is selected and loaded.
  assert.deepEqual(pollRuns(st, [RUNS[1]]), {empty: false, controls: true, reload: true});
  assert.equal(st.sel.run, 'checked');
  // No run left.
  assert.deepEqual(pollRuns(st, []), {empty: true, controls: false, reload: false});
  assert.equal(st.sel, null);
});
