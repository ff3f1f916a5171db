// The loss-scale track under the heatmap: pure helpers (no DOM), tested with node --test.
//
// Under mixed precision the writer stores, at every written step, the loss
// scale that step's gradient was made with (`loss_scale`) and the steps the
// optimizer refused since the previous write (`refused_steps`; a refused
// step has a non-finite gradient, moves no weight and halves the scale).
// Both are the same in every row, so the track is read from row 0 of an
// ordinary `heatmap` response of each metric, asked with the heatmap's own
// width and binning: its columns are then the heatmap's columns, one for one.

/** Per-step series the tab draws as a track, not as a heatmap (metadata.TRACK_METRICS). */
export const TRACK_METRICS = Object.freeze(['loss_scale', 'refused_steps']);

/** @param {string} metric @returns {boolean} whether the metric is drawn as a track, not offered as a heatmap. */
export function isTrackMetric(metric) {
  return TRACK_METRICS.includes(metric);
}

/**
 * Row 0 of a heatmap response, one value per step column (null: missing).
 * @param {object} resp A `heatmap` response, `encoding` "json" or "f32".
 * @returns {(number|null)[]}
 */
export function firstRow(resp) {
  const n = resp.steps.length;
  if (!resp.layers || !resp.layers.length) return new Array(n).fill(null);
  if (resp.encoding !== 'f32') {
    return resp.values.map((line) => {
      const v = line[0];
      if (v === null || v === undefined) return null;
      return typeof v === 'string' ? Number(v) : v; // "NaN", "Infinity": Number() reads both
    });
  }
  // f32: row-major steps x rows, so row 0 of step c is element c * rows.
  const bytes = decodeBase64(resp.values_f32);
  const values = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  const missing = decodeBase64(resp.missing_bits);
  const rows = resp.layers.length;
  const out = new Array(n);
  for (let c = 0; c < n; c++) {
    const i = c * rows;
    const bit = (missing[i >> 3] >> (7 - (i & 7))) & 1; // numpy.packbits: most significant bit first
    out[c] = bit ? null : values[i];
  }
  return out;
}

/**
 * The track of one run, column-aligned with its heatmap.
 * @param {object} scaleResp `heatmap` response of metric loss_scale.
 * @param {object|null} refusedResp `heatmap` response of refused_steps (same width), or null.
 * @returns {{steps: number[], stepEnds: number[]|null, scale: (number|null)[],
 *   refused: (number|null)[]}|null} null when no step has a loss scale.
 */
export function lossScaleTrack(scaleResp, refusedResp) {
  const scale = firstRow(scaleResp);
  if (!scale.some((v) => v !== null && Number.isFinite(v) && v > 0)) return null;
  const refused = refusedResp ? firstRow(refusedResp) : new Array(scale.length).fill(null);
  if (refused.length !== scale.length) {
    throw new Error(`Expected the loss-scale and refused-step responses to have the same columns. ` +
      `Received: ${scale.length} and ${refused.length}`);
  }
  return {steps: scaleResp.steps, stepEnds: scaleResp.step_ends ?? null, scale, refused};
}

/**
 * Where to draw the track in a box of `width` x `height` pixels.
 *
 * The scale moves by factors of two (halved on a refused step, doubled after
 * a run of good ones), so y is log2 of the scale; x is the centre of the
 * heatmap column (column i of n spans [i, i+1) * width / n).
 * @returns {{points: {x: number, y: number, scale: number, step: number}[],
 *   refused: {x: number, count: number, step: number}[], top: number|null, bottom: number|null}}
 */
export function trackLayout(track, width, height, pad = 3) {
  const n = track.scale.length;
  const logs = track.scale.map((v) => (v !== null && Number.isFinite(v) && v > 0 ? Math.log2(v) : null));
  const present = logs.filter((v) => v !== null);
  const top = present.length ? Math.max(...present) : null;
  const bottom = present.length ? Math.min(...present) : null;
  const span = top !== null && top > bottom ? top - bottom : 1;
  const x = (i) => ((i + 0.5) * width) / n;
  const y = (l) => (top === bottom ? height / 2 : pad + ((top - l) / span) * (height - 2 * pad));
  const points = [];
  const refused = [];
  for (let i = 0; i < n; i++) {
    if (logs[i] !== null) points.push({x: x(i), y: y(logs[i]), scale: track.scale[i], step: track.steps[i]});
    const r = track.refused[i];
    if (r !== null && r > 0) refused.push({x: x(i), count: r, step: track.steps[i]});
  }
  return {points, refused, top: top === null ? null : 2 ** top, bottom: bottom === null ? null : 2 ** bottom};
}

function decodeBase64(text) {
  if (typeof atob === 'function') {
    const s = atob(text);
    const out = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  return new Uint8Array(Buffer.from(text, 'base64'));
}
