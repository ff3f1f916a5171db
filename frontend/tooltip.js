// What the tooltip says about the bin under the pointer (pure; tested under node).

import {formatValue} from './format.js';
import {sourceRows} from './rows.js';

/**
 * The rows, steps and value of a drawn bin.
 * @param {object} plan rows.buildPlan
 * @param {string[]} names Every row.
 * @param {{d0, d1, col0, col1, value, status}} bin HeatmapCanvas.binAt
 * @param {object} resp The heatmap JSON (steps, step_ends, metric, ...).
 * @param {object} grid The decoded grid (absent rows in side-by-side).
 * @param {object} [display] name -> label for rows named by an index (state.display).
 */
export function cellRows(plan, names, bin, resp, grid, display = {}) {
  const src = sourceRows(plan, bin.d0, bin.d1);
  const ends = resp.step_ends || resp.steps;
  return {
    row: src[0], rowEnd: src[src.length - 1], count: src.length,
    rowName: names[src[0]], rowEndName: names[src[src.length - 1]],
    rowLabel: display[names[src[0]]] || names[src[0]], rowEndLabel: display[names[src[src.length - 1]]] || names[src[src.length - 1]],
    absent: !!(grid.absent && src.every((r) => grid.absent[r])),
    step: resp.steps[bin.col0], stepEnd: ends[bin.col1],
    value: bin.value, valueText: formatValue(bin.value, resp.metric), status: bin.status,
    metric: resp.metric, aggregate: resp.aggregate, reduce: resp.reduce || 'max',
    noun: resp.granularity === 'variable' ? 'variable' : 'layer', hasStatus: !!grid.status,
  };
}

/**
 * Tooltip lines: [key, value, className?].
 * @param {object} c cellRows(...) plus run, paneRun, ratio, otherName, and
 *   check (the `checks` answer of the run, or null).
 */
export function tooltipRows(c) {
  const rows = [[c.ratio ? 'runs' : 'run', c.run]];
  const first = c.rowLabel || c.rowName;
  if (c.count > 1) rows.push([`${c.noun}s`, `${first} \u2026 ${c.rowEndLabel || c.rowEndName} (${c.count.toLocaleString('en-US')}, max)`]);
  else rows.push([c.noun, first]);
  if (c.otherName && c.otherName !== c.rowName && c.count === 1) rows.push(['aligned with', c.otherName]);
  rows.push(c.stepEnd !== c.step ? ['steps', `${c.step}\u2013${c.stepEnd}`] : ['step', String(c.step)]);
  const binned = c.stepEnd !== c.step || c.count > 1;
  let cls = c.value === null ? 'tip-missing' : Number.isFinite(c.value) ? '' : 'tip-bad';
  const key = c.ratio ? `ratio (${c.metric})` : c.metric;
  let text = c.valueText;
  if (c.absent) text = `no such ${c.noun} in ${c.paneRun}`;
  else if (c.ratio && c.value === null) text = 'no value in one of the runs';
  else if (c.ratio && Number.isFinite(c.value)) text = `${c.valueText}\u00d7`;
  if (c.absent) cls = 'tip-missing';
  rows.push([binned ? `${key} (${c.reduce})` : key, text, cls]);
  if (c.aggregate && c.aggregate !== 'last') rows.push(['aggregate', c.aggregate]);
  if (c.hasStatus) rows.push(...checkRows(c));
  return rows;
}

/**
 * The tooltip's lines on a cell of a gradient check: its verdict, and what
 * the row's last check could detect.
 * @param {object} c As tooltipRows'.
 */
export function checkRows(c) {
  const rows = [['check', c.status || 'not checked', c.status === 'mismatch' ? 'tip-bad' : '']];
  const power = checkPower(c.check, c.rowName);
  if (power !== null && c.count === 1) rows.push(['power', `would catch errors \u2265 ${formatValue(power)} (last check)`]);
  const source = RECHECK_TEXT[checkRecheck(c.check, c.rowName)];
  if (source && c.count === 1) rows.push(['decided by', source]);
  return rows;
}

// What each `float64_recheck` value (metadata.CHECK_RECHECKS) says in the
// tooltip; "none" (the check's own dtype decided) says nothing.
const RECHECK_TEXT = {
  float64: 'the float64 twin (float32 left it inconclusive; last check)',
  unavailable: 'nothing: the float64 twin could not re-check it (last check)',
};

/**
 * Whose verdict the row's last check holds (`float64_recheck`: "none",
 * "float64" or "unavailable"), or null when the records do not say.
 */
export function checkRecheck(check, rowName) {
  if (!check || !Array.isArray(check.rows)) return null;
  const row = check.rows.find((r) => r.name === rowName);
  return row && typeof row.float64_recheck === 'string' ? row.float64_recheck : null;
}

/**
 * The smallest relative error the row's last check could detect, when the
 * check records carry a `min_detectable_error` column, else null.
 */
export function checkPower(check, rowName) {
  if (!check || !Array.isArray(check.rows)) return null;
  const row = check.rows.find((r) => r.name === rowName);
  const v = row ? row.min_detectable_error : undefined;
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}
