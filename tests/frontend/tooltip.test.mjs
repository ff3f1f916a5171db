// Unit tests of frontend/tooltip.js (node --test): what the tooltip says.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {buildPlan, groupRows} from '../../frontend/rows.js';
import {cellRows, checkPower, checkRecheck, checkRows, tooltipRows} from '../../frontend/tooltip.js';

const NAMES = ['t/b0/q', 't/b0/k', 't/b1/q', 't/b1/k'];
const RESP = {metric: 'grad_norm', aggregate: 'max', granularity: 'layer', steps: [0, 10, 20], step_ends: [9, 19, 29], reduce: 'max'};
const GRID = {status: null};

test('one_row_bin_names_the_row_step_range_and_value', () => {
  const plan = buildPlan(NAMES, groupRows(NAMES));
  const c = cellRows(plan, NAMES, {d0: 2, d1: 2, col0: 1, col1: 1, value: 0.25, status: null}, RESP, GRID);
  const rows = Object.fromEntries(tooltipRows({...c, run: 'r', paneRun: 'r'}).map(([k, v]) => [k, v]));
  assert.deepEqual(rows, {run: 'r', layer: 't/b1/q', steps: '10\u201319', 'grad_norm (max)': '0.25', aggregate: 'max'});
});

test('a_collapsed_block_says_which_rows_it_holds', () => {
  const groups = groupRows(NAMES);
  const plan = buildPlan(NAMES, groups, {collapsed: new Set([groups[1].key])});
  const c = cellRows(plan, NAMES, {d0: 2, d1: 2, col0: 0, col1: 0, value: NaN, status: null}, RESP, GRID);
  const lines = tooltipRows({...c, run: 'r', paneRun: 'r'});
  assert.deepEqual(lines[1], ['layers', 't/b1/q \u2026 t/b1/k (2, max)']);
  assert.deepEqual(lines[3], ['grad_norm (max)', 'NaN', 'tip-bad']);
});

test('check_power_is_shown_when_the_check_records_carry_it', () => {
  const check = {rows: [{name: 'a', min_detectable_error: 0.021}, {name: 'b'}]};
  assert.equal(checkPower(check, 'a'), 0.021);
  assert.equal(checkPower(check, 'b'), null);
  assert.equal(checkPower(null, 'a'), null);
  const plan = buildPlan(['a', 'b'], []);
  const c = cellRows(plan, ['a', 'b'], {d0: 0, d1: 0, col0: 0, col1: 0, value: 1e-4, status: 'ok'},
    {metric: 'check_error', granularity: 'layer', steps: [0], step_ends: null}, {status: new Int8Array(2)});
  const lines = Object.fromEntries(tooltipRows({...c, run: 'r', paneRun: 'r', check}).map(([k, v]) => [k, v]));
  assert.equal(lines.check, 'ok');
  assert.equal(lines.power, 'would catch errors \u2265 0.021 (last check)');
});

test('a_check_cell_says_its_verdict_and_power_in_the_check_lines', () => {
  const check = {rows: [{name: 'a', min_detectable_error: 0.021}]};
  const one = {status: 'mismatch', check, rowName: 'a', count: 1};
  assert.deepEqual(checkRows(one), [['check', 'mismatch', 'tip-bad'], ['power', 'would catch errors \u2265 0.021 (last check)']]);
  // A bin of several rows has no one row's power; a row never checked says so.
  assert.deepEqual(checkRows({...one, count: 2, status: null}), [['check', 'not checked', '']]);
});

test('a_row_settled_by_the_float64_twin_says_so_and_an_old_record_says_nothing', () => {
  const check = {rows: [
    {name: 'a', status: 'mismatch', float64_recheck: 'float64'},
    {name: 'b', status: 'inconclusive', float64_recheck: 'unavailable'},
    {name: 'c', status: 'ok', float64_recheck: 'none'},
    {name: 'd', status: 'ok'},
  ]};
  assert.equal(checkRecheck(check, 'a'), 'float64');
  assert.equal(checkRecheck(check, 'd'), null);
  const lines = (name, status) => Object.fromEntries(checkRows({status, check, rowName: name, count: 1}));
  assert.match(lines('a', 'mismatch')['decided by'], /float64 twin/);
  assert.match(lines('b', 'inconclusive')['decided by'], /could not/);
  assert.equal(lines('c', 'ok')['decided by'], undefined);
  assert.equal(lines('d', 'ok')['decided by'], undefined);
  // A bin of several rows has no one row's source.
  assert.equal(Object.fromEntries(checkRows({status: 'mismatch', check, rowName: 'a', count: 2}))['decided by'], undefined);
});

test('the_tooltip_shows_a_label_and_keeps_the_name_for_lookups', () => {
  const names = ['0', '2'];
  const plan = buildPlan(names, [], {display: {2: '2 (Linear)'}});
  const resp = {steps: [0], step_ends: null, metric: 'grad_norm', aggregate: 'last', granularity: 'layer'};
  const c = cellRows(plan, names, {d0: 1, d1: 1, col0: 0, col1: 0, value: 0.5, status: null}, resp, {}, {2: '2 (Linear)'});
  assert.equal(c.rowName, '2'); // what the check and findings are matched by
  const rows = tooltipRows({...c, run: 'mlp'});
  assert.deepEqual(rows[1], ['layer', '2 (Linear)']);
});
