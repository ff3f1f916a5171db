// The plugin's routes, seen from the tab (no DOM; tested under node): URL
// builders, fetching JSON, and dropping responses that arrive after the
// selection changed.
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

// Parameters a matrix request may carry, in URL order. `encoding=f32` is
// always sent: base64 float32 is exact and far cheaper for the server to
// encode than JSON numbers (docs/http_api.md).
const MATRIX_PARAMS = ['run', 'other', 'metric', 'granularity', 'aggregate', 'width', 'reduce', 'align',
  'first_step', 'last_step', 'row_start', 'row_end'];

function matrixUrl(route, q) {
  const params = new URLSearchParams();
  for (const k of MATRIX_PARAMS) {
    let v = q[k];
    if (v === null || v === undefined || v === '') continue;
    if (k === 'width') v = Math.max(1, Math.min(100000, Math.round(v)));
    params.set(k, String(v));
  }
  params.set('encoding', 'f32');
  return `${route}?${params.toString()}`;
}

/**
 * The URL of a heatmap request.
 * @param {{run, metric, granularity?, aggregate?, width?, reduce?,
 *   first_step?, last_step?, row_start?, row_end?}} q
 * @returns {string} e.g. "heatmap?run=a&metric=grad_norm&width=1200&encoding=f32"
 */
export function heatmapUrl(q) {
  return matrixUrl('heatmap', {...q, other: null, align: null});
}

/** The URL of a compare request: run over other, the heatmap's parameters plus `align`. */
export function compareUrl(q) {
  return matrixUrl('compare', q);
}

/**
 * The URL of an alignment: which rows of run are which rows of other.
 * @param {{run, other, granularity?, metric?, align?}} q `metric` only says
 *   whose rows (check_error: the gradient check's); `align` is name,
 *   structure or auto.
 * @returns {string} e.g. "align?run=a&other=b&granularity=layer&align=auto"
 */
export function alignUrl(q) {
  const params = new URLSearchParams();
  for (const k of ['run', 'other', 'granularity', 'metric', 'align']) {
    if (q[k] !== null && q[k] !== undefined && q[k] !== '') params.set(k, String(q[k]));
  }
  return 'align?' + params.toString();
}

/** The URL of the findings of one run: "findings?run=a". */
export function findingsUrl(run) {
  return 'findings?' + new URLSearchParams({run}).toString();
}

/** The URL of a run's gradient checks: "checks?run=a&granularity=layer". */
export function checksUrl(run, granularity = 'layer') {
  return 'checks?' + new URLSearchParams({run, granularity}).toString();
}

/**
 * The URL of the export route: the unbinned matrix of a selection as a file.
 * @param {{run, metric, granularity?, aggregate?}} q
 * @param {'csv'|'json'} format
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

/** The client for the plugin's routes: one channel per thing on screen. */
export class Api {
  /** @param {typeof fetch} [fetchImpl] */
  constructor(fetchImpl) {
    this.fetchImpl = fetchImpl || ((...a) => globalThis.fetch(...a));
    this.channels = new Map();
  }

  channel(name) {
    let c = this.channels.get(name);
    if (!c) {
      c = new LatestRequest();
      this.channels.set(name, c);
    }
    return c;
  }

  /** GET a relative URL on a channel: a newer request on it makes this one stale. */
  get(name, url) {
    return this.channel(name).run((signal) => fetchJson(url, signal, this.fetchImpl));
  }

  cancel(name) {
    this.channel(name).cancel();
  }

  runs() {
    return this.get('runs', 'runs');
  }
}
