// Unit tests of frontend/scene.js (node --test): what the painted tab says
// (legend, titles, chart caption, zoom and alignment notes, absent rows).
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {makeRatioScale, makeScale, RATIO_SPECIAL_COLORS} from '../../frontend/colour.js';
import {buildPlan, groupRows} from '../../frontend/rows.js';
import {alignNoteLines, chartCaption, displayAbsent, legendOptions, noDataText, plotTitles, zoomNote} from '../../frontend/scene.js';

const LOG = makeScale('log', {min: 1e-6, max: 1});
const RATIO = makeRatioScale(2);
const BASE = {metric: 'grad_norm', mode: null, side: false, scale: LOG, scaleKind: 'log', noScale: false, hasStatus: false,
  run: 'sigmoid', other: null};

test('the_legend_names_the_metric_and_scale_and_says_both_runs_side_by_side', () => {
  assert.deepEqual(legendOptions(BASE),
    {title: 'gradient norm (grad_norm), log', showZero: true, showMismatch: false, noScale: false});
  assert.deepEqual(legendOptions({...BASE, scaleKind: 'linear', side: true, other: 'relu_he'}),
    {title: 'gradient norm (grad_norm), both runs', showZero: false, showMismatch: false, noScale: false});
  // An activation metric's empty cell is a layer without that statistic.
  assert.deepEqual(legendOptions({...BASE, metric: 'act_rms'}).specialLabels, {missing: 'not recorded'});
  // A check's cells carry statuses: the legend shows the mismatch outline.
  const check = legendOptions({...BASE, metric: 'check_error', hasStatus: true, noScale: true});
  assert.equal(check.title, 'gradient check error (check_error), log');
  assert.equal(check.showMismatch, true);
  assert.equal(check.noScale, true);
});

test('a_ratio_legend_says_which_run_each_end_favours', () => {
  const o = legendOptions({...BASE, mode: 'ratio', scale: RATIO, other: 'relu_he'});
  assert.equal(o.title, 'ratio sigmoid \u00f7 relu_he, grad_norm');
  assert.deepEqual([o.lowLabel, o.highLabel], ['relu_he larger', 'sigmoid larger']);
  assert.equal(o.specials, RATIO_SPECIAL_COLORS);
  assert.equal(o.specialLabels.nonfinite, 'NaN / \u00f7 0');
});

test('a_ratio_metric_uses_its_own_ends_on_the_diverging_scale', () => {
  const o = legendOptions({...BASE, metric: 'clip_ratio', scale: RATIO, side: true});
  assert.equal(o.title, 'before-clip / applied norm (clip_ratio), both runs');
  assert.equal(o.showZero, true);
  assert.deepEqual([o.lowLabel, o.highLabel], ['applied larger', 'clipped (before-clip larger)']);
  assert.equal(o.specialLabels.missing, 'no value');
});

test('titles_name_the_runs_only_when_comparing', () => {
  assert.deepEqual(plotTitles(null, false, 'a', null), {main: '', other: ''});
  assert.deepEqual(plotTitles('side', true, 'a', 'b'), {main: 'a', other: 'b'});
  assert.deepEqual(plotTitles('side', false, 'a', 'b'), {main: 'a', other: ''}); // b failed to load
  assert.deepEqual(plotTitles('ratio', false, 'a', 'b'), {main: 'a \u00f7 b', other: ''});
});

test('the_chart_caption_follows_the_hovered_row_then_the_finding_then_says_what_it_draws', () => {
  const base = {hovered: null, what: 'grad_norm', noun: 'layer', rows: 11, emphasised: 0, kind: ''};
  assert.equal(chartCaption(base), 'grad_norm of every layer \u00b7 hover the heatmap to follow one');
  assert.equal(chartCaption({...base, rows: 2000, noun: 'variable'}),
    'grad_norm of 2,000 rows (median and range) \u00b7 hover the heatmap to follow one');
  assert.equal(chartCaption({...base, emphasised: 1, kind: 'Vanishing gradients'}), 'Vanishing gradients \u00b7 1 row in colour');
  assert.equal(chartCaption({...base, emphasised: 6, kind: 'Vanishing gradients'}), 'Vanishing gradients \u00b7 6 rows in colour');
  assert.equal(chartCaption({...base, hovered: 'mlp/dense_3', emphasised: 6, what: 'ratio'}), 'mlp/dense_3 \u00b7 ratio');
});

test('the_zoom_note_counts_rows_from_one', () => {
  assert.equal(zoomNote({rows: [0, 1233], steps: [100, 250]}), 'Zoomed: rows 1\u20131,234, steps 100\u2013250');
  assert.equal(zoomNote({rows: [4, 9], steps: null}), 'Zoomed: rows 5\u201310, every step');
});

test('the_alignment_note_lists_rows_only_one_run_has_up_to_twenty', () => {
  const alignment = {mode: 'name', basis: 'names', roots: ['', '']};
  assert.deepEqual(alignNoteLines(null, [[], []], 5, 'a', 'b'), []);
  assert.deepEqual(alignNoteLines(alignment, [[], []], 5, 'a', 'b'), ['rows aligned by name: 5 of 5 rows in both a and b']);
  const many = Array.from({length: 25}, (_, i) => `x${i}`);
  const lines = alignNoteLines(alignment, [['extra'], many], 40, 'a', 'b');
  assert.equal(lines[0], 'rows aligned by name: 14 of 40 rows in both a and b');
  assert.equal(lines[1], 'Only in a: extra');
  assert.equal(lines[2], `Only in b: ${many.slice(0, 20).join(', ')}, \u2026`);
});

test('a_display_row_is_absent_only_when_all_its_rows_are', () => {
  const names = ['t/b0/q', 't/b0/k', 't/b1/q', 't/b1/k'];
  const groups = groupRows(names);
  const absent = Uint8Array.from([1, 1, 1, 0]);
  assert.deepEqual(Array.from(displayAbsent(buildPlan(names, groups), absent)), [1, 1, 1, 0]);
  const collapsed = buildPlan(names, groups, {collapsed: new Set(groups.map((g) => g.key))});
  assert.deepEqual(Array.from(displayAbsent(collapsed, absent)), [1, 0]);
});

test('an_empty_plot_says_whether_steps_or_rows_are_missing', () => {
  assert.equal(noDataText(0), 'No steps recorded yet for this selection.');
  assert.equal(noDataText(40), 'No row matches the filter.');
});
