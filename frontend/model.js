// Data side of the Gradients tab: fetching `runs` and `heatmap`, dropping
// stale responses, choosing a valid selection, and the text of the status
// line. No DOM here, so the pure parts run under node.
//
// URLs are relative on purpose: fetch() resolves them against the iframe's
// <base href="plugin/gradients/">, which keeps working under --path_prefix,
// /experiment/<id>/ and notebook proxies.

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
 * @returns {string} e.g. "heatmap?run=a&metric=grad_norm&granularity=layer&width=1200"
 */
export function heatmapUrl(q) {
  const params = new URLSearchParams();
  params.set('run', q.run);
  params.set('metric', q.metric);
  if (q.granularity) params.set('granularity', q.granularity);
  if (q.aggregate) params.set('aggregate', q.aggregate);
  if (q.width) params.set('width', String(Math.max(1, Math.min(100000, Math.round(q.width)))));
  if (q.reduce) params.set('reduce', q.reduce);
  return 'heatmap?' + params.toString();
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
  }

  /** @returns {Promise<{stale, value?: {runs: object[], samples_per_plugin}}>} */
  runs() {
    return this.runsChannel.run((signal) => fetchJson('runs', signal, this.fetchImpl));
  }

  /** @returns {Promise<{stale, value?: object}>} The heatmap JSON. */
  heatmap(q) {
    return this.heatmapChannel.run((signal) => fetchJson(heatmapUrl(q), signal, this.fetchImpl));
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
  const grans = Object.keys(info.granularities || {});
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
