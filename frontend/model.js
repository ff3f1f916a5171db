// Data side of the Gradients tab: fetching `runs` and `heatmap`, dropping
// stale responses, choosing a valid selection, and the text of the status
// line. No DOM here, so the pure parts run under node.
//
// URLs are relative on purpose: fetch() resolves them against the iframe's
// <base href="plugin/gradients/">, which keeps working under --path_prefix,
// /experiment/<id>/ and notebook proxies.

import {parseF32Heatmap} from './heatmap.js';

/** An HTTP error answer from the plugin; message holds the server's text. */
export class HttpError extends Error {
  constructor(status, statusText, body, url) {
    const text = (body || '').trim();
    super(text ? `${status} ${statusText}: ${text}` : `${status} ${statusText}`);
    this.name = 'HttpError';
    this.status = status;
    this.body = text;
    this.url = url;
  }
}

/**
 * Fetches JSON; a non-2xx answer throws HttpError with the body's text.
 * @param {string} url Relative URL.
 * @param {AbortSignal} [signal]
 * @param {typeof fetch} [fetchImpl] For tests; default the global fetch.
 */
export async function fetchJson(url, signal, fetchImpl = globalThis.fetch) {
  const resp = await fetchImpl(url, {signal, headers: {Accept: 'application/json'}});
  if (!resp.ok) {
    let body = '';
    try {
      body = await resp.text();
    } catch (e) {
      body = '';
    }
    // A long HTML error page is not a message; keep the first lines.
    if (body.length > 2000) body = body.slice(0, 2000) + '\u2026';
    throw new HttpError(resp.status, resp.statusText, body, url);
  }
  return resp.json();
}

/**
 * The URL of a heatmap request.
 * @param {{run: string, metric: string, granularity?: string,
 *   aggregate?: string|null, width?: number|null, reduce?: string|null}} q
 * @returns {string} e.g. "heatmap?run=a&metric=grad_norm&granularity=layer&width=1200&encoding=f32"
 */
export function heatmapUrl(q) {
  const params = new URLSearchParams();
  params.set('run', q.run);
  params.set('metric', q.metric);
  if (q.granularity) params.set('granularity', q.granularity);
  if (q.aggregate) params.set('aggregate', q.aggregate);
  if (q.width) params.set('width', String(Math.max(1, Math.min(100000, Math.round(q.width)))));
  if (q.reduce) params.set('reduce', q.reduce);
  // Base64 float32 instead of JSON numbers: exact, and much cheaper for the
  // server to encode on large runs (see docs/http_api.md).
  params.set('encoding', 'f32');
  return 'heatmap?' + params.toString();
}

/**
 * The URL of a compare request (run over other, same parameters as heatmap).
 * @param {{run: string, other: string, metric: string, granularity?: string,
 *   aggregate?: string|null, width?: number|null, reduce?: string|null}} q
 * @returns {string} e.g. "compare?run=a&other=b&metric=grad_norm&width=1200&encoding=f32"
 */
export function compareUrl(q) {
  const params = new URLSearchParams(heatmapUrl(q).slice('heatmap?'.length));
  const out = new URLSearchParams();
  out.set('run', q.run);
  out.set('other', q.other);
  for (const [k, v] of params) if (k !== 'run') out.set(k, v);
  return 'compare?' + out.toString();
}

/** The URL of the findings of one run: "findings?run=a". */
export function findingsUrl(run) {
  return 'findings?' + new URLSearchParams({run}).toString();
}

/**
 * The URL of the export route: the unbinned matrix of a selection as a file.
 * @param {{run: string, metric: string, granularity?: string, aggregate?: string|null}} q
 * @param {'csv'|'json'} format Default "csv".
 * @returns {string} e.g. "export?run=a&metric=grad_norm&granularity=layer&format=csv"
 */
export function exportUrl(q, format = 'csv') {
  const params = new URLSearchParams();
  params.set('run', q.run);
  params.set('metric', q.metric);
  if (q.granularity) params.set('granularity', q.granularity);
  if (q.aggregate) params.set('aggregate', q.aggregate);
  params.set('format', format);
  return 'export?' + params.toString();
}

/**
 * Runs one request at a time per channel: starting a new one aborts the
 * previous, and a response that arrives after a newer request started is
 * reported as stale instead of being used.
 */
export class LatestRequest {
  constructor() {
    this.seq = 0;
    this.controller = null;
  }

  /**
   * @param {(signal: AbortSignal) => Promise<*>} start
   * @returns {Promise<{stale: boolean, value?: *}>} Rejects with the request's
   *   error only when it is still the latest.
   */
  async run(start) {
    const seq = ++this.seq;
    if (this.controller) this.controller.abort();
    const controller = typeof AbortController === 'function' ? new AbortController() : null;
    this.controller = controller;
    try {
      const value = await start(controller ? controller.signal : undefined);
      if (seq !== this.seq) return {stale: true};
      return {stale: false, value};
    } catch (err) {
      if (seq !== this.seq) return {stale: true};
      throw err;
    } finally {
      if (this.controller === controller && seq === this.seq) this.controller = null;
    }
  }

  /** Makes every request in flight stale. */
  cancel() {
    this.seq++;
    if (this.controller) this.controller.abort();
    this.controller = null;
  }
}

/** The client for the plugin's routes. */
export class Api {
  /** @param {typeof fetch} [fetchImpl] */
  constructor(fetchImpl) {
    this.fetchImpl = fetchImpl || ((...a) => globalThis.fetch(...a));
    this.runsChannel = new LatestRequest();
    this.heatmapChannel = new LatestRequest();
    this.otherChannel = new LatestRequest();
    this.findingsChannel = new LatestRequest();
  }

  /** @returns {Promise<{stale, value?: {runs: object[], samples_per_plugin}}>} */
  runs() {
    return this.runsChannel.run((signal) => fetchJson('runs', signal, this.fetchImpl));
  }

  /** @returns {Promise<{stale, value?: object}>} The heatmap JSON. */
  heatmap(q) {
    return this.heatmapChannel.run((signal) => fetchJson(heatmapUrl(q), signal, this.fetchImpl));
  }

  /**
   * The main view's matrix: `compare` when q.other is set (ratio mode), else
   * `heatmap`. Shares the heatmap channel: one main matrix at a time.
   */
  mainMatrix(q) {
    const url = q.other ? compareUrl(q) : heatmapUrl(q);
    return this.heatmapChannel.run((signal) => fetchJson(url, signal, this.fetchImpl));
  }

  /** The second run's heatmap, side by side (its own channel). */
  otherHeatmap(q) {
    return this.otherChannel.run((signal) => fetchJson(heatmapUrl(q), signal, this.fetchImpl));
  }

  /** @returns {Promise<{stale, value?: {run, findings: object[]}}>} */
  findings(run) {
    return this.findingsChannel.run((signal) => fetchJson(findingsUrl(run), signal, this.fetchImpl));
  }
}

/** Metric names a person reads, keyed by the metric id the server uses. */
export const METRIC_LABELS = {
  grad_norm: 'gradient norm',
  grad_max_abs: 'max |gradient|',
  grad_zero_fraction: 'zero fraction',
  grad_nonfinite: 'non-finite count',
  weight_norm: 'weight norm',
  grad_to_weight: 'gradient / weight norm',
  check_error: 'gradient check error',
};

/** "gradient norm (grad_norm)" for known metrics, the id for others. */
export function metricLabel(metric) {
  const label = METRIC_LABELS[metric];
  return label ? `${label} (${metric})` : metric;
}

/**
 * Picks a valid selection for the runs, keeping each part of `prev` that is
 * still valid.
 * @param {object[]} runs The `runs` list of the runs route.
 * @param {{run?, metric?, granularity?, aggregate?}} prev
 * @returns {{run: string, metric: string, granularity: string,
 *   aggregate: string|null}|null} null when there are no runs. aggregate is
 *   null when the run lists no aggregates for the metric (the server then
 *   uses its default).
 */
export function reconcileSelection(runs, prev = {}) {
  if (!runs || runs.length === 0) return null;
  const info = runs.find((r) => r.run === prev.run) || runs[0];
  const metrics = info.metrics || [];
  const metric = metrics.includes(prev.metric)
    ? prev.metric
    : metrics.includes('grad_norm')
      ? 'grad_norm'
      : metrics[0] || null;
  // Only granularities that hold the metric (check_error may be layer-only).
  const all = Object.keys(info.granularities || {});
  const holding = granularitiesWithMetric(info, metric);
  const grans = holding.length ? holding : all;
  const granularity = grans.includes(prev.granularity)
    ? prev.granularity
    : grans.includes('layer')
      ? 'layer'
      : grans[0] || 'layer';
  const aggs = aggregatesOf(info, metric);
  const aggregate = aggs.length === 0
    ? null
    : aggs.includes(prev.aggregate)
      ? prev.aggregate
      : aggs.includes('last')
        ? 'last'
        : aggs[0];
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

/** "layer" -> "layers", "variable" -> "variables", with a count. */
export function rowNoun(granularity, n) {
  const noun = granularity === 'variable' ? 'variable' : 'layer';
  return `${n.toLocaleString('en-US')} ${noun}${n === 1 ? '' : 's'}`;
}

function plural(n, word) {
  return `${n.toLocaleString('en-US')} ${word}${n === 1 ? '' : 's'}`;
}

/**
 * The parts of the status line above the heatmap.
 * @param {object} info The run's entry in `runs`.
 * @param {object} resp The heatmap JSON.
 * @param {{cols: number, rows: number}} drawn The grid actually drawn (after
 *   client-side binning).
 * @returns {{text: string, kind: 'info'|'warn'}[]}
 */
export function statusParts(info, resp, drawn) {
  const parts = [];
  const numSteps = resp.num_steps != null ? resp.num_steps : resp.steps.length;
  const granularity = resp.granularity || 'layer';
  let stepText = plural(numSteps, 'step');
  if (resp.steps.length > 0) {
    const first = resp.steps[0];
    const last = resp.step_ends ? resp.step_ends[resp.step_ends.length - 1] : resp.steps[resp.steps.length - 1];
    if (last !== first) stepText += ` (${first}\u2013${last})`;
  }
  parts.push({text: stepText, kind: 'info'});
  parts.push({text: rowNoun(granularity, resp.layers.length), kind: 'info'});
  const window = info && info.window;
  if (window > 1) {
    const agg = resp.aggregate || 'last';
    parts.push({text: `written every ${window} training steps, ${agg} of each window`, kind: 'info'});
  }
  const total = resp.total_steps != null ? resp.total_steps : info && info.total_steps;
  if (info && info.sampled) {
    const m = total != null ? total.toLocaleString('en-US') : 'more';
    parts.push({
      text:
        `showing ${numSteps.toLocaleString('en-US')} of ${m} steps (TensorBoard sampled this series; ` +
        'start it with --samples_per_plugin gradients=0 to keep all)',
      kind: 'warn',
    });
  }
  const serverBinned = Array.isArray(resp.step_ends);
  const cols = drawn ? drawn.cols : resp.steps.length;
  if (serverBinned || cols < resp.steps.length) {
    const reduce = (serverBinned && resp.reduce) || 'max';
    parts.push({text: `binned to ${cols.toLocaleString('en-US')} columns (${reduce} per bin)`, kind: 'info'});
  }
  if (drawn && drawn.rows < resp.layers.length) {
    parts.push({text: `rows binned to ${drawn.rows.toLocaleString('en-US')} (max per bin)`, kind: 'info'});
  }
  return parts;
}

// ---------------------------------------------------------------------------
// Comparing runs

/** Row names of a, then those only b has: the rows of a side-by-side view. */
export function unionRows(a, b) {
  const seen = new Set(a);
  return a.concat(b.filter((r) => !seen.has(r)));
}

/**
 * A heatmap response re-indexed onto other rows (rows aligned by name).
 * @param {object} resp The heatmap JSON.
 * @param {string[]} rows Row names to show, e.g. from unionRows.
 * @returns {object} A copy with `layers` = rows, `values` (and `status`)
 *   remapped, null where the run has no such row, and `absent[i]` true for
 *   those rows.
 */
export function alignRows(resp, rows) {
  if (resp.encoding === 'f32') resp = nestedValues(resp);
  const index = new Map(resp.layers.map((r, j) => [r, j]));
  const cols = rows.map((r) => (index.has(r) ? index.get(r) : -1));
  const pick = (line) => cols.map((j) => (j < 0 || !line ? null : line[j]));
  return {
    ...resp,
    layers: rows.slice(),
    values: resp.values.map(pick),
    status: resp.status ? resp.status.map(pick) : resp.status,
    absent: cols.map((j) => j < 0),
  };
}

/**
 * An `encoding=f32` response in the nested-list form (numbers, null for
 * missing), for the few places that re-arrange rows before drawing.
 * @param {object} resp
 * @returns {object} resp with `values` as lists and `encoding: 'json'`.
 */
export function nestedValues(resp) {
  const grid = parseF32Heatmap(resp);
  const values = [];
  for (let c = 0; c < grid.cols; c++) {
    const line = new Array(grid.rows);
    for (let r = 0; r < grid.rows; r++) {
      const i = r * grid.cols + c;
      line[r] = grid.missing[i] ? null : grid.values[i];
    }
    values.push(line);
  }
  const {values_f32: _v, missing_bits: _m, ...rest} = resp;
  return {...rest, values, encoding: 'json'};
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

// ---------------------------------------------------------------------------
// Findings

/** Headings for the kinds of finding the server reports. */
export const KIND_LABELS = {
  non_finite: 'Non-finite gradients',
  check_failure: 'Gradient check failed',
  exploding: 'Exploding gradients',
  vanishing: 'Vanishing gradients',
  dead: 'Dead layers',
};

const SEVERITY_RANK = {error: 2, warning: 1};

/** Orders findings most severe first (errors, then warnings), stable otherwise. */
export function sortFindings(findings) {
  return findings
    .map((f, i) => [f, i])
    .sort((a, b) => (SEVERITY_RANK[b[0].severity] || 0) - (SEVERITY_RANK[a[0].severity] || 0) || a[1] - b[1])
    .map(([f]) => f);
}

/** A key that names a finding across reloads: its kind and layers. */
export function findingKey(f) {
  return `${f.kind}:${(f.layers || []).join('\u0000')}`;
}

/**
 * The rows a layer name covers: the row of that name (layer granularity),
 * or the rows under it (variable granularity, "layer/kernel").
 */
function rowsOfLayer(layer, rows) {
  const out = [];
  rows.forEach((r, i) => {
    if (r === layer || r.startsWith(layer + '/')) out.push(i);
  });
  return out;
}

/**
 * The cells of a finding on a heatmap's rows.
 * @param {object} f A finding.
 * @param {string[]} rows The heatmap's `layers`.
 * @returns {{rows: number[], ranges: [number, number][]}} Row indices and,
 *   per row, the inclusive step range: the layer's own
 *   evidence.first_step/last_step when given, else the finding's `steps`.
 */
export function findingCells(f, rows) {
  const out = {rows: [], ranges: []};
  const fallback = Array.isArray(f.steps) && f.steps.length === 2 ? f.steps : null;
  for (const layer of f.layers || []) {
    const e = f.evidence && f.evidence[layer];
    const range = e && Number.isFinite(e.first_step) && Number.isFinite(e.last_step) ? [e.first_step, e.last_step] : fallback;
    for (const r of rowsOfLayer(layer, rows)) {
      out.rows.push(r);
      out.ranges.push(range);
    }
  }
  return out;
}

/**
 * Marks for the row labels: which rows a finding names, by worst severity.
 * @returns {{row: number, severity: string, kinds: string[]}[]} In row order.
 */
export function rowMarks(findings, rows) {
  const marks = new Map();
  for (const f of findings || []) {
    for (const layer of f.layers || []) {
      for (const r of rowsOfLayer(layer, rows)) {
        const m = marks.get(r) || {row: r, severity: f.severity, kinds: []};
        if ((SEVERITY_RANK[f.severity] || 0) > (SEVERITY_RANK[m.severity] || 0)) m.severity = f.severity;
        if (!m.kinds.includes(f.kind)) m.kinds.push(f.kind);
        marks.set(r, m);
      }
    }
  }
  return [...marks.values()].sort((a, b) => a.row - b.row);
}

/**
 * A number for people: 3 significant digits, exponent notation below 1e-3
 * and from 1e5 up, integers grouped. null/undefined -> "\u2014".
 */
export function formatNumber(v) {
  if (v === null || v === undefined) return '\u2014';
  if (typeof v === 'string') return v;
  if (Number.isNaN(v)) return 'NaN';
  if (!Number.isFinite(v)) return v > 0 ? 'Infinity' : '-Infinity';
  if (v === 0) return '0';
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < 1e15) return v.toLocaleString('en-US');
  if (a < 1e-3 || a >= 1e5) return v.toExponential(2).replace(/\.?0+e/, 'e').replace('e+', 'e');
  return String(Number(v.toPrecision(3)));
}

function percent(v) {
  if (!Number.isFinite(v)) return formatNumber(v);
  const p = v * 100;
  if (p !== 0 && Math.abs(p) < 0.01) return `${formatNumber(p)}%`;
  return `${Number(p.toPrecision(3))}%`;
}

// How an evidence entry reads: label, and formatter (fractions as percent).
const EVIDENCE_FIELDS = {
  median_norm: ['median norm', formatNumber],
  max_norm: ['max norm', formatNumber],
  median_orders_below_later_layers: ['orders below later layers (median)', formatNumber],
  max_over_median_orders: ['orders above median (max)', formatNumber],
  growth_orders: ['growth over run (orders)', formatNumber],
  fraction_of_steps: ['steps affected', percent],
  median_zero_fraction: ['zero fraction (median)', percent],
  steps_over: ['steps over', formatNumber],
  steps_with_nonfinite: ['steps with NaN/Inf', formatNumber],
  nonfinite_elements: ['non-finite elements', formatNumber],
  max_relative_error: ['max relative error', percent],
  checks_failed: ['checks failed', formatNumber],
  checks_run: ['checks run', formatNumber],
  reason: ['reason', String],
};

/**
 * The evidence of a finding as text, one entry per layer.
 * @returns {{layer: string, items: [string, string][]}[]} items are
 *   [label, formatted value]; first_step/last_step become one "steps" item.
 */
export function evidenceItems(f) {
  const out = [];
  for (const layer of f.layers || []) {
    const e = (f.evidence || {})[layer];
    if (!e) continue;
    const items = [];
    if (e.first_step != null) {
      items.push(['steps', e.last_step != null && e.last_step !== e.first_step ? `${e.first_step}\u2013${e.last_step}` : String(e.first_step)]);
    }
    for (const [k, v] of Object.entries(e)) {
      if (k === 'first_step' || k === 'last_step') continue;
      const [label, fmt] = EVIDENCE_FIELDS[k] || [k.replace(/_/g, ' '), formatNumber];
      items.push([label, v === null || v === undefined ? '\u2014' : fmt(v)]);
    }
    out.push({layer, items});
  }
  return out;
}

/**
 * The one number that says most about a layer in a finding, for the list
 * of affected layers (e.g. a failed check's relative error), or "".
 */
export function layerHeadline(f, layer) {
  const e = (f.evidence || {})[layer];
  if (!e) return '';
  switch (f.kind) {
    case 'check_failure':
      return e.max_relative_error != null ? `rel. error ${percent(e.max_relative_error)}` : '';
    case 'exploding':
      return e.max_norm != null ? `max norm ${formatNumber(e.max_norm)}` : '';
    case 'vanishing':
      if (e.median_orders_below_later_layers != null) return `${formatNumber(e.median_orders_below_later_layers)} orders below`;
      return e.median_norm != null ? `median norm ${formatNumber(e.median_norm)}` : '';
    case 'dead':
      return e.median_zero_fraction != null ? `${percent(e.median_zero_fraction)} zeros` : '';
    case 'non_finite':
      return e.steps_with_nonfinite != null ? `${formatNumber(e.steps_with_nonfinite)} step${e.steps_with_nonfinite === 1 ? '' : 's'}` : '';
    default:
      return '';
  }
}

/** "steps 250\u2013300", "step 30", or "" for a finding's step range. */
export function stepRangeText(steps) {
  if (!Array.isArray(steps) || steps.length !== 2) return '';
  const [a, b] = steps;
  return a === b ? `step ${a.toLocaleString('en-US')}` : `steps ${a.toLocaleString('en-US')}\u2013${b.toLocaleString('en-US')}`;
}
