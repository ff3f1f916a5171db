// The selection and what the status line says about it (pure; tested under node).

import {metricLabel, plural, rowNoun} from './format.js';
import {isTrackMetric} from './losstrack.js';

/**
 * The aggregate a metric opens on. A run written every step has only
 * `last`. A windowed run (every_n_steps > 1) opens on `max` where it has
 * one: the window exists so that a one-step spike or NaN between writes is
 * kept, and `last` is exactly the aggregate that hides it.
 * @param {string[]} aggs The run's aggregates for the metric.
 * @returns {string|null}
 */
export function defaultAggregate(aggs) {
  if (!aggs.length) return null;
  if (aggs.includes('max')) return 'max';
  return aggs.includes('last') ? 'last' : aggs[0];
}

/**
 * Picks a valid selection, keeping each part of `prev` that is still valid.
 * @param {object[]} runs The `runs` list of the runs route.
 * @param {{run?, metric?, granularity?, aggregate?}} prev
 * @param {string|null} [preferRun] The run to open on when prev names none
 *   that exists (the one whose findings are most severe).
 * @returns {{run, metric, granularity, aggregate}|null} null without runs;
 *   aggregate is null when the run lists none for the metric.
 */
export function reconcileSelection(runs, prev = {}, preferRun = null) {
  if (!runs || runs.length === 0) return null;
  const info = runs.find((r) => r.run === prev.run) || runs.find((r) => r.run === preferRun) || runs[0];
  const metrics = info.metrics || [];
  const metric = metrics.includes(prev.metric) ? prev.metric : metrics.includes('grad_norm') ? 'grad_norm' : metrics[0] || null;
  const all = Object.keys(info.granularities || {});
  const holding = granularitiesWithMetric(info, metric);
  const grans = holding.length ? holding : all;
  const granularity = grans.includes(prev.granularity) ? prev.granularity : grans.includes('layer') ? 'layer' : grans[0] || 'layer';
  const aggs = aggregatesOf(info, metric);
  // An aggregate is kept only on the same run and metric: another run's
  // `last` must not hide this run's windows.
  const same = prev.run === info.run && prev.metric === metric;
  const aggregate = same && aggs.includes(prev.aggregate) ? prev.aggregate : defaultAggregate(aggs);
  return {run: info.run, metric, granularity, aggregate};
}

/**
 * The granularities of a run that hold a metric, in the run's order. A
 * granularity without a `metrics` list (an older server) counts as holding
 * every metric of the run.
 */
export function granularitiesWithMetric(info, metric) {
  const grans = (info && info.granularities) || {};
  return Object.keys(grans).filter((g) => !Array.isArray(grans[g].metrics) || grans[g].metrics.includes(metric));
}

/** The aggregates a run offers for a metric ([] when none are listed). */
export function aggregatesOf(info, metric) {
  const a = info && info.aggregates && info.aggregates[metric];
  return Array.isArray(a) ? a : [];
}

/**
 * The metric picker's options: the metrics the server lists for the run, in
 * its order, each under its label (format.metricLabel). Track metrics (the
 * loss scale) are drawn under the heatmap, not offered as heatmaps.
 * @param {object} info The run's entry in `runs`.
 * @returns {{value: string, label: string}[]}
 */
export function metricChoices(info) {
  return ((info && info.metrics) || []).filter((m) => !isTrackMetric(m)).map((m) => ({value: m, label: metricLabel(m)}));
}

/**
 * The parts of the status line above the heatmap.
 * @param {object} info The run's entry in `runs`.
 * @param {object} resp The heatmap JSON.
 * @param {{rows: number, shownRows: number, pixelRows: number}} shown Rows of
 *   the run, display rows (after grouping and filter), and pixel rows drawn.
 * @returns {{text: string, kind: 'info'|'warn'}[]}
 */
export function statusParts(info, resp, shown) {
  const parts = [];
  const numSteps = resp.num_steps != null ? resp.num_steps : resp.steps.length;
  let stepText = plural(numSteps, 'step');
  if (resp.steps.length > 0) {
    const first = resp.steps[0];
    const last = resp.step_ends ? resp.step_ends[resp.step_ends.length - 1] : resp.steps[resp.steps.length - 1];
    if (last !== first) stepText += ` (${first.toLocaleString('en-US')}\u2013${last.toLocaleString('en-US')})`;
  }
  parts.push({text: stepText, kind: 'info'});
  const granularity = resp.granularity || 'layer';
  const rows = shown ? shown.rows : resp.layers.length;
  parts.push({text: rowNoun(granularity, rows), kind: 'info'});
  const every = info && info.window;
  if (every > 1) {
    parts.push({text: `written every ${every} training steps, ${resp.aggregate || 'last'} of each window`, kind: 'info'});
  }
  const total = resp.total_steps != null ? resp.total_steps : info && info.total_steps;
  if (info && info.sampled) {
    const m = total != null ? total.toLocaleString('en-US') : 'more';
    const why = info.capped ?
      'a uniform sample: the run is larger than one read of TensorBoard\'s data server can carry; see the note above' :
      'TensorBoard sampled this series; start it with --samples_per_plugin gradients=0 to keep all';
    parts.push({text: `showing ${numSteps.toLocaleString('en-US')} of ${m} steps (${why})`, kind: 'warn'});
  }
  if (Array.isArray(resp.step_ends)) {
    parts.push({text: `${resp.steps.length.toLocaleString('en-US')} columns (${resp.reduce || 'max'} per bin)`, kind: 'info'});
  }
  if (shown && shown.pixelRows < shown.shownRows) {
    parts.push({text: `${shown.shownRows.toLocaleString('en-US')} rows in ${shown.pixelRows.toLocaleString('en-US')} pixel rows (max per bin)`, kind: 'info'});
  }
  return parts;
}

/**
 * Whether a poll of `runs` brought new data for the shown runs.
 * @param {object[]} before The previous `runs` list.
 * @param {object[]} after The new one.
 * @param {string[]} names The runs on screen (the selected run, and the
 *   compared one).
 * @returns {boolean} true when any of them changed its last_write, appeared
 *   or disappeared.
 */
export function runsChanged(before, after, names) {
  const stamp = (list, name) => {
    const r = (list || []).find((x) => x.run === name);
    return r ? `${r.last_write ?? ''}|${r.total_steps ?? ''}` : null;
  };
  return names.some((n) => n && stamp(before, n) !== stamp(after, n));
}
