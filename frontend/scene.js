// What the painted tab says, decided from the state (pure; tested under
// node): the legend's title, ends and special colours, the plots' titles,
// the chart's caption, the zoom and alignment notes, and which display rows
// a run lacks. paint.js puts these into the DOM.

import {alignmentText} from './compare.js';
import {isActivationMetric, metricLabel, ratioMetricEnds, stepRangeText} from './format.js';
import {planRows, sourceRows} from './rows.js';

/**
 * The legend's options (views.renderLegend) for the scale a paint used.
 * @param {{metric: string, mode: string|null, side: boolean, scale: object,
 *   scaleKind: string, noScale: boolean, hasStatus: boolean, run: string,
 *   other: string|null}} o metric: the answer's metric; mode: compare mode;
 *   side: two plots drawn; scale: the colour scale; scaleKind: the state's
 *   log or linear; noScale: no value is on the scale; hasStatus: the grid
 *   carries check statuses (mismatch outlines).
 */
export function legendOptions(o) {
  const label = metricLabel(o.metric);
  const both = o.side ? ', both runs' : '';
  const ends = ratioMetricEnds(o.metric);
  if (o.mode === 'ratio') {
    return {
      title: `ratio ${o.run} \u00f7 ${o.other}, ${o.metric}`, showZero: true, noScale: o.noScale,
      specials: o.scale.specials, specialLabels: {nonfinite: 'NaN / \u00f7 0', missing: 'no value', zero: '0'},
      lowLabel: `${o.other} larger`, highLabel: `${o.run} larger`,
    };
  }
  if (ends) {
    // A ratio metric (before-clip / applied) on the diverging scale: its ends say which way is which.
    return {
      title: `${label}${both}`, showZero: true, noScale: o.noScale, specials: o.scale.specials,
      specialLabels: {nonfinite: 'NaN / Inf', missing: 'no value', zero: '0'}, lowLabel: ends.low, highLabel: ends.high,
    };
  }
  const plain = {
    title: `${label}${o.scaleKind === 'log' ? ', log' : ''}${both}`,
    showZero: o.scaleKind === 'log', showMismatch: o.hasStatus, noScale: o.noScale,
  };
  // An activation metric's empty cell is a layer without that statistic, not a missing gradient.
  return isActivationMetric(o.metric) ? {...plain, specialLabels: {missing: 'not recorded'}} : plain;
}

/** The titles above the two plots: none for one run, the ratio's runs, or each plot's run. */
export function plotTitles(mode, side, run, other) {
  return {
    main: mode === 'ratio' ? `${run} \u00f7 ${other}` : mode ? run : '',
    other: side ? other : '',
  };
}

/**
 * The caption above the chart.
 * @param {{hovered: string|null, what: string, noun: string, rows: number,
 *   emphasised: number, kind: string}} o hovered: the label of the display
 *   row under the pointer (null: none); what: the metric or 'ratio'; noun:
 *   'layer' or 'variable'; rows: display rows; emphasised: rows of the
 *   spotlighted finding in colour; kind: that finding's label.
 */
export function chartCaption(o) {
  if (o.hovered !== null) return `${o.hovered} \u00b7 ${o.what}`;
  if (o.emphasised) return `${o.kind} \u00b7 ${o.emphasised} row${o.emphasised === 1 ? '' : 's'} in colour`;
  const lines = o.rows > 64 ? `${o.rows.toLocaleString('en-US')} rows (median and range)` : `every ${o.noun}`;
  return `${o.what} of ${lines} \u00b7 hover the heatmap to follow one`;
}

/** The row bar's note on a zoom: "Zoomed: rows 3–40, steps 100–200" (rows 1-based). */
export function zoomNote(zoom) {
  const steps = zoom.steps ? stepRangeText(zoom.steps) : 'every step';
  const row = (r) => (r + 1).toLocaleString('en-US');
  return `Zoomed: rows ${row(zoom.rows[0])}\u2013${row(zoom.rows[1])}, ${steps}`;
}

/**
 * The lines of the note on a comparison: which alignment, how many rows
 * both runs have, and (the first 20 of) those only one has.
 * @param {object|null} alignment compare.alignmentOf, null when not comparing.
 * @param {[string[], string[]]} onlyIn Rows only in run, rows only in other.
 * @param {number} total Shown rows.
 */
export function alignNoteLines(alignment, onlyIn, total, run, other) {
  if (!alignment) return [];
  const [onlyA, onlyB] = onlyIn;
  const list = (names) => `${names.slice(0, 20).join(', ')}${names.length > 20 ? ', \u2026' : ''}`;
  const lines = [alignmentText(alignment, run, other, total - onlyA.length - onlyB.length, total)];
  if (onlyA.length) lines.push(`Only in ${run}: ${list(onlyA)}`);
  if (onlyB.length) lines.push(`Only in ${other}: ${list(onlyB)}`);
  return lines;
}

/**
 * Which display rows a run lacks: those whose every source row is absent.
 * @param {object} plan rows.buildPlan.
 * @param {Uint8Array} absent Per source row, 1 where the run lacks it (wire.pickRows).
 * @returns {Uint8Array} Per display row.
 */
export function displayAbsent(plan, absent) {
  const out = new Uint8Array(planRows(plan));
  for (let d = 0; d < out.length; d++) {
    out[d] = sourceRows(plan, d, d).every((s) => absent[s]) ? 1 : 0;
  }
  return out;
}

/** What a plot with nothing drawn says: no steps yet, or no row left by the filter. */
export function noDataText(cols) {
  return cols === 0 ? 'No steps recorded yet for this selection.' : 'No row matches the filter.';
}
