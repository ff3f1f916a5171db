// Axes of the Gradients tab (pure; tested under node): nice ticks for
// values and steps, and where a step falls on a step-linear x axis.
//
// The x axis is linear in steps, also when TensorBoard sampled the series
// (steps 0, 7, 19, 55, ...) or the server binned it: column c spans from its
// first step to the next column's first step, so equal distances on screen
// are equal numbers of training steps.

// ---------------------------------------------------------------------------
// Ticks

function decimal(x) {
  // Removes binary noise from a tick computed as start + i * step.
  return Number(x.toPrecision(12));
}

/**
 * Nice linear ticks (multiples of 1, 2 or 5 times a power of ten).
 * @param {number} min
 * @param {number} max
 * @param {number} count About how many ticks, default 5.
 * @returns {number[]} Ascending ticks inside [min, max].
 */
export function linearTicks(min, max, count = 5) {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  if (!(max > min)) return [min];
  const raw = (max - min) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const f = raw / mag;
  const step = (f >= 7.5 ? 10 : f >= 3.5 ? 5 : f >= 1.5 ? 2 : 1) * mag;
  const first = Math.ceil(min / step - 1e-9);
  const last = Math.floor(max / step + 1e-9);
  const ticks = [];
  for (let i = first; i <= last; i++) ticks.push(decimal(i * step));
  return ticks;
}

/**
 * Log ticks. Up to three decades: 1, 2 and 5 times powers of ten when that
 * gives 3 to maxTicks ticks. Otherwise powers of ten inside [min, max],
 * thinned to at most maxTicks by taking every k-th decade; failing both (a
 * range narrower than a 1-2-5 step), the linear ticks.
 * @param {number} min > 0
 * @param {number} max >= min
 * @param {number} maxTicks Default 7.
 * @returns {number[]} Ascending ticks inside [min, max].
 */
export function logTicks(min, max, maxTicks = 7) {
  if (!(min > 0) || !(max >= min) || !Number.isFinite(max)) return [];
  const lo = Math.ceil(Math.log10(min) - 1e-9);
  const hi = Math.floor(Math.log10(max) + 1e-9);
  const decades = hi - lo + 1;
  if (decades <= 3) {
    const ticks = [];
    for (let e = lo - 1; e <= hi; e++) {
      for (const m of [1, 2, 5]) {
        const v = Number(`${m}e${e}`);
        if (v >= min * (1 - 1e-9) && v <= max * (1 + 1e-9)) ticks.push(v);
      }
    }
    if (ticks.length >= 3 && ticks.length <= maxTicks) return ticks;
    if (decades < 2 && ticks.length >= 2 && ticks.length <= maxTicks) return ticks;
  }
  if (decades >= 2) {
    const every = Math.ceil(decades / maxTicks);
    // Align thinned decades on multiples of `every` (1e-9, 1e-6, 1e-3, 1e0).
    const start = Math.ceil(lo / every) * every;
    const ticks = [];
    for (let e = start; e <= hi; e += every) ticks.push(Number(`1e${e}`));
    if (ticks.length >= 2) return ticks;
  }
  return linearTicks(min, max, Math.min(4, maxTicks)).filter((v) => v > 0);
}

/**
 * Labels for a set of ticks, all in one notation: plain decimals when every
 * tick reads well that way (0.001 <= |v| < 1e5, or 0), else exponent
 * notation for all ("1e-8", "2.5e-7", "1e0").
 * @param {number[]} ticks
 * @returns {string[]}
 */
export function formatTicks(ticks) {
  const plain = ticks.every((v) => v === 0 || (Math.abs(v) >= 1e-3 && Math.abs(v) < 1e5));
  return ticks.map((v) => {
    const r = Number(v.toPrecision(6));
    if (plain) return String(r);
    if (r === 0) return '0';
    return r.toExponential().replace('e+', 'e');
  });
}

/**
 * Step ticks for the x axis, placed on the columns that hold them.
 * @param {number[]} steps First step of each column, ascending.
 * @param {number[]|null} stepEnds Last step of each column when binned.
 * @param {number} maxTicks About how many, default 6.
 * @returns {{step: number, x: number}[]} x is the position as a fraction of
 *   the heatmap width (0 = left edge of column 0, 1 = right edge of the last).

/**
 * The step-linear x axis of a heatmap's columns.
 * @param {number[]} steps First step of each column, ascending.
 * @param {number[]|null} stepEnds Last step of each column when binned.
 * @param {{first: number, end: number}|null} [range] Steps the width spans
 *   (default: this series' own).
 * @returns {{first: number, end: number, edges: Float64Array}} Steps
 *   [first, end) fill the width; edges[c] is column c's left edge as a
 *   fraction of the width, edges[n] = 1. A column reaches the next one's
 *   first step, so a sampled gap is filled by the sample before it.
 */
export function stepAxis(steps, stepEnds, range = null) {
  const n = steps.length;
  const edges = new Float64Array(n + 1);
  if (n === 0) return {first: range ? range.first : 0, end: range ? range.end : 1, edges};
  // The last column is as wide as a typical column: a bin's own steps, or
  // for unbinned columns the median gap between them (a check written every
  // 10 steps keeps 10-step cells to the end).
  const own = stepEnds ? stepEnds[n - 1] + 1 : steps[n - 1] + medianGap(steps);
  // A shared range (two runs side by side) puts equal steps above each other.
  const first = range ? range.first : steps[0];
  const end = range ? range.end : own;
  const span = end - first;
  for (let c = 0; c < n; c++) edges[c] = (steps[c] - first) / span;
  edges[n] = Math.min(1, (own - first) / span);
  return {first, end, edges};
}

function medianGap(steps) {
  if (steps.length < 2) return 1;
  const gaps = [];
  for (let i = 1; i < steps.length; i++) gaps.push(steps[i] - steps[i - 1]);
  gaps.sort((a, b) => a - b);
  return Math.max(1, gaps[(gaps.length - 1) >> 1]);
}

/** Where step s falls on a stepAxis, as a fraction of the width (the middle of its step). */
export function stepX(axis, s) {
  return (s - axis.first + 0.5) / (axis.end - axis.first);
}

/**
 * Step ticks for the x axis.
 * @param {{first: number, end: number}} axis From stepAxis.
 * @param {number} maxTicks About how many, default 6.
 * @returns {{step: number, x: number}[]} x as a fraction of the width.
 */
export function stepTicks(axis, maxTicks = 6) {
  const last = axis.end - 1;
  if (axis.edges && axis.edges.length === 2) return [{step: axis.first, x: 0.5}];
  if (last <= axis.first) return [{step: axis.first, x: 0.5}];
  return linearTicks(axis.first, last, maxTicks)
    .filter((v) => Number.isInteger(v))
    .map((v) => ({step: v, x: stepX(axis, v)}));
}

/**
 * For each of `width` pixel columns, the data columns it shows.
 * @param {Float64Array} edges From stepAxis.
 * @param {number} width Pixels.
 * @returns {{start: Int32Array, end: Int32Array}} Inclusive column range per
 *   pixel: every column that overlaps the pixel, so a one-step spike narrower
 *   than a pixel still colours it (extremes are kept, as the server keeps
 *   them); start -1 (and end -2) where the pixel holds no column.
 */
export function pixelColumns(edges, width) {
  const n = edges.length - 1;
  const start = new Int32Array(width);
  const end = new Int32Array(width);
  let c = 0;
  for (let x = 0; x < width; x++) {
    const x0 = x / width;
    const x1 = (x + 1) / width;
    if (x1 <= edges[0] || x0 >= edges[n]) {
      // Outside this series' steps (a shared axis with a longer run): no column.
      start[x] = -1;
      end[x] = -2;
      continue;
    }
    while (c < n - 1 && edges[c + 1] <= x0) c++;
    start[x] = c;
    let e = c;
    while (e < n - 1 && edges[e + 1] < x1) e++;
    end[x] = e;
  }
  return {start, end};
}

/** Index of the last column whose first step is <= s, or -1. Binary search. */
export function columnOfStep(steps, s) {
  let lo = 0;
  let hi = steps.length - 1;
  if (hi < 0 || s < steps[0]) return -1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (steps[mid] <= s) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * The columns that hold any step of [first, last].
 * @returns {[number, number]|null} Inclusive [col0, col1], or null when no
 *   column holds a step of the range.
 */
export function columnRange(steps, stepEnds, first, last) {
  const n = steps.length;
  if (n === 0 || last < first) return null;
  const end = (c) => (stepEnds ? stepEnds[c] : steps[c]);
  let c0 = columnOfStep(steps, first);
  if (c0 < 0) c0 = 0;
  else if (end(c0) < first) c0 += 1;
  const c1 = columnOfStep(steps, last);
  if (c0 >= n || c1 < c0) return null;
  return [c0, c1];
}
