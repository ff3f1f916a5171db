// Heatmap drawing for the Gradients tab: colour map, scales, ticks, binning,
// parsing and formatting (pure, tested under node), plus the canvas view.
//
// Grid layout used throughout: the server sends values[step][row]; the tab
// draws rows top to bottom and steps left to right, so a grid is stored
// row-major by display row: index = row * cols + col. A grid is
//   {rows, cols, values: Float64Array, missing: Uint8Array}
// where values holds the number (NaN and +-Infinity as themselves) and
// missing[i] = 1 marks "no gradient" (JSON null); values[i] is then 0.

// ---------------------------------------------------------------------------
// Colours

// Viridis (van der Walt & Smith, matplotlib's default map; public domain),
// sampled at these LUT indices. Between knots the LUT is a cubic Hermite
// interpolation with averaged-secant tangents: that reproduces every entry
// of the published 256-entry table to within 0.6/255 per channel, so after
// rounding each entry is within 1 of it. The extra knot at 248 follows the
// dip of the blue channel near the yellow end.
const VIRIDIS_KNOTS = [0, 15, 30, 45, 60, 75, 90, 105, 120, 135, 150, 165, 180, 195, 210, 225, 240, 248, 255];
const VIRIDIS_RGB = [
  [0.267004, 0.004874, 0.329415], [0.281924, 0.089666, 0.412415], [0.280255, 0.165693, 0.476498],
  [0.263663, 0.237631, 0.518762], [0.237441, 0.305202, 0.541921], [0.208623, 0.367752, 0.552675],
  [0.182256, 0.426184, 0.55712], [0.159194, 0.482237, 0.558073], [0.13777, 0.537492, 0.554906],
  [0.121148, 0.592739, 0.544641], [0.128087, 0.647749, 0.523491], [0.180653, 0.701402, 0.488189],
  [0.274149, 0.751988, 0.436601], [0.395174, 0.797475, 0.367757], [0.535621, 0.835785, 0.281908],
  [0.688944, 0.865448, 0.182725], [0.845561, 0.887322, 0.099702], [0.926106, 0.89733, 0.104071],
  [0.993248, 0.906157, 0.143936],
];

/** Number of entries in the colour lookup table. */
export const LUT_SIZE = 256;

/**
 * Builds the viridis lookup table.
 * @returns {Uint8ClampedArray} LUT_SIZE * 4 bytes, RGBA, alpha 255; entry 0 is
 *   the low end (dark purple), entry 255 the high end (yellow).
 */
export function buildViridisLut() {
  const knots = VIRIDIS_KNOTS;
  const n = knots.length;
  const slope = (j, c) => (VIRIDIS_RGB[j + 1][c] - VIRIDIS_RGB[j][c]) / (knots[j + 1] - knots[j]);
  const tangent = (i, c) => {
    if (i === 0) return slope(0, c);
    if (i === n - 1) return slope(n - 2, c);
    return (slope(i - 1, c) + slope(i, c)) / 2;
  };
  const lut = new Uint8ClampedArray(LUT_SIZE * 4);
  let s = 0;
  for (let k = 0; k < LUT_SIZE; k++) {
    while (s < n - 2 && knots[s + 1] <= k) s++;
    const h = knots[s + 1] - knots[s];
    const t = (k - knots[s]) / h;
    const t2 = t * t;
    const t3 = t2 * t;
    for (let c = 0; c < 3; c++) {
      const v =
        (2 * t3 - 3 * t2 + 1) * VIRIDIS_RGB[s][c] +
        (t3 - 2 * t2 + t) * h * tangent(s, c) +
        (-2 * t3 + 3 * t2) * VIRIDIS_RGB[s + 1][c] +
        (t3 - t2) * h * tangent(s + 1, c);
      lut[k * 4 + c] = Math.round(v * 255);
    }
    lut[k * 4 + 3] = 255;
  }
  return lut;
}

/** The viridis LUT, built once at module load. */
export const VIRIDIS_LUT = buildViridisLut();

/**
 * Colours of the cells that are not on the colour scale. None of them is a
 * viridis colour: red and light grey are far from every entry, and black is
 * darker than viridis' darkest purple.
 */
export const SPECIAL_COLORS = Object.freeze({
  nonfinite: Object.freeze([255, 23, 68]), // NaN or +-Infinity: #ff1744
  missing: Object.freeze([221, 221, 221]), // no gradient (null): #dddddd
  zero: Object.freeze([0, 0, 0]), // zero or negative on a log scale: #000000
});

// Diverging map for ratios (run / other), centred on 1: ColorBrewer RdBu
// (9 classes, Cynthia Brewer, Apache-2.0), reversed so "below the other run"
// is blue and "above" is red, with the near-white class at the centre. The
// two darkest classes are left out: black then stays a special colour.
const RDBU_KNOTS = [
  [33, 102, 172], [67, 147, 195], [146, 197, 222], [209, 229, 240], [247, 247, 247],
  [253, 219, 199], [244, 165, 130], [214, 96, 77], [178, 24, 43],
];

/**
 * Builds a LUT by linear interpolation between evenly spaced RGB knots.
 * @param {number[][]} knots [r, g, b] in 0..255, low end first.
 * @returns {Uint8ClampedArray} LUT_SIZE * 4 bytes, RGBA, alpha 255.
 */
export function buildKnotLut(knots) {
  const lut = new Uint8ClampedArray(LUT_SIZE * 4);
  const last = knots.length - 1;
  for (let k = 0; k < LUT_SIZE; k++) {
    const x = (k / (LUT_SIZE - 1)) * last;
    const s = Math.min(last - 1, Math.floor(x));
    const t = x - s;
    for (let c = 0; c < 3; c++) lut[k * 4 + c] = Math.round(knots[s][c] + (knots[s + 1][c] - knots[s][c]) * t);
    lut[k * 4 + 3] = 255;
  }
  return lut;
}

/** The diverging ratio LUT: blue (ratio < 1), near white (1), red (> 1). */
export const RATIO_LUT = buildKnotLut(RDBU_KNOTS);

/**
 * Special colours on the ratio map. Red and light grey would read as "a bit
 * above 1" and "about 1" there, so a ratio's NaN/Inf is yellow, "no value"
 * (either run lacks it) a mid grey, and zero (the run's value is 0) black.
 */
export const RATIO_SPECIAL_COLORS = Object.freeze({
  nonfinite: Object.freeze([255, 214, 0]), // #ffd600
  missing: Object.freeze([158, 158, 158]), // #9e9e9e
  zero: Object.freeze([0, 0, 0]),
});

/** Outline colour for check_error cells whose status is "mismatch". */
export const MISMATCH_COLOR = '#ff00e5';

/** Outline of highlighted cells (a finding's), the tab's accent orange. */
export const HIGHLIGHT_COLOR = '#f57c00';

/** CSS colour string for an [r, g, b] triple. */
export function rgbCss(rgb) {
  return `rgb(${rgb[0]}, ${rgb[1]}, ${rgb[2]})`;
}

// ---------------------------------------------------------------------------
// Parsing

const STRING_VALUES = {NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity};

/**
 * Parses one JSON cell value of the heatmap route.
 * @param {*} x A number, null (no gradient), or one of the strings "NaN",
 *   "Infinity", "-Infinity" that TensorBoard's encoder writes.
 * @returns {number|null} The number (NaN and infinities included), or null
 *   for a missing value. Any other string is taken as NaN: it is not a
 *   number, and red is the colour that makes a reader look.
 */
export function parseValue(x) {
  if (typeof x === 'number') return x;
  if (x === null || x === undefined) return null;
  if (typeof x === 'string') {
    if (Object.prototype.hasOwnProperty.call(STRING_VALUES, x)) return STRING_VALUES[x];
    return NaN;
  }
  return NaN;
}

/** Status codes of a check_error status grid, index = code. */
export const STATUS_NAMES = [null, 'ok', 'mismatch', 'inconclusive'];
export const STATUS_MISMATCH = 2;

/**
 * Turns a heatmap response into a grid (rows = layers, cols = steps).
 * @param {{layers: string[], steps: number[], values: Array<Array<*>>,
 *   status?: Array<Array<string|null>>|null}} resp The JSON of `heatmap`.
 * @returns {{rows: number, cols: number, values: Float64Array,
 *   missing: Uint8Array, status: Uint8Array|null}} status holds indices
 *   into STATUS_NAMES, or is null when the response has no status matrix.
 * @throws {Error} The matrix does not have one row per step and one value
 *   per layer.
 */
export function parseHeatmap(resp) {
  if (resp.encoding === 'f32') return parseF32Heatmap(resp);
  const rows = resp.layers.length;
  const cols = resp.steps.length;
  if (!Array.isArray(resp.values) || resp.values.length !== cols) {
    throw new Error(
      `Expected one row of values per step. Received: ${cols} steps, ` +
        `${Array.isArray(resp.values) ? resp.values.length : typeof resp.values} rows of values`,
    );
  }
  const values = new Float64Array(rows * cols);
  const missing = new Uint8Array(rows * cols);
  for (let c = 0; c < cols; c++) {
    const line = resp.values[c];
    if (!Array.isArray(line) || line.length !== rows) {
      throw new Error(
        `Expected ${rows} values (one per layer) at step ${resp.steps[c]}. ` +
          `Received: ${Array.isArray(line) ? line.length : typeof line}`,
      );
    }
    for (let r = 0; r < rows; r++) {
      const v = parseValue(line[r]);
      const i = r * cols + c;
      if (v === null) missing[i] = 1;
      else values[i] = v;
    }
  }
  return {rows, cols, values, missing, status: parseStatus(resp, rows, cols)};
}

/**
 * The grid of an `encoding=f32` response: base64 little-endian float32,
 * step-major (one float per row at each step), and a packbits bitmap of the
 * missing cells (most significant bit first), transposed to display rows.
 * @param {object} resp
 * @returns {{rows: number, cols: number, values: Float64Array, missing: Uint8Array, status: Uint8Array|null}}
 */
export function parseF32Heatmap(resp) {
  const rows = resp.layers.length;
  const cols = resp.steps.length;
  const bytes = base64Bytes(resp.values_f32);
  if (bytes.length !== rows * cols * 4) {
    throw new Error(
      `Expected ${rows * cols} float32 values (${cols} steps x ${rows} rows). Received: ${bytes.length} bytes`,
    );
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const bits = base64Bytes(resp.missing_bits);
  const values = new Float64Array(rows * cols);
  const missing = new Uint8Array(rows * cols);
  for (let c = 0; c < cols; c++) {
    for (let r = 0; r < rows; r++) {
      const k = c * rows + r;
      const i = r * cols + c;
      if ((bits[k >> 3] >> (7 - (k & 7))) & 1) missing[i] = 1;
      else values[i] = view.getFloat32(k * 4, true);
    }
  }
  return {rows, cols, values, missing, status: parseStatus(resp, rows, cols)};
}

/** The status matrix of a check_error response as STATUS_NAMES codes by display row, or null. */
function parseStatus(resp, rows, cols) {
  if (!resp.status) return null;
  const status = new Uint8Array(rows * cols);
  for (let c = 0; c < cols; c++) {
    const sline = resp.status[c] || [];
    for (let r = 0; r < rows; r++) {
      const code = STATUS_NAMES.indexOf(sline[r] === undefined ? null : sline[r]);
      status[r * cols + c] = code < 0 ? 0 : code;
    }
  }
  return status;
}

/** Sizes canvases to pw x ph device pixels shown at cssW x cssH; returns the first one's cleared context. */
function sizeCanvases(canvases, pw, ph, cssW, cssH) {
  for (const c of canvases) {
    if (c.width !== pw) c.width = pw;
    if (c.height !== ph) c.height = ph;
    c.style.width = `${cssW}px`;
    c.style.height = `${cssH}px`;
  }
  const ctx = canvases[0].getContext('2d');
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.clearRect(0, 0, pw, ph);
  return ctx;
}

function base64Bytes(text) {
  const binary = atob(text || '');
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

// ---------------------------------------------------------------------------
// Scales

/**
 * The value range a scale should span.
 * @param {Float64Array|number[]} values Cell values.
 * @param {Uint8Array|null} missing Missing mask (1 = skip), or null.
 * @param {'log'|'linear'} kind Log takes finite values > 0 only (zeros and
 *   negatives are not on a log scale); linear takes every finite value.
 * @returns {{min: number, max: number}|null} null when no value qualifies.
 */
export function valueDomain(values, missing, kind) {
  let min = Infinity;
  let max = -Infinity;
  const log = kind === 'log';
  for (let i = 0; i < values.length; i++) {
    if (missing && missing[i]) continue;
    const v = values[i];
    if (!Number.isFinite(v) || (log && !(v > 0))) continue;
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return min <= max ? {min, max} : null;
}

/**
 * Makes a scale that maps a value to [0, 1].
 * @param {'log'|'linear'} kind
 * @param {{min: number, max: number}|null} domain From valueDomain. A
 *   degenerate domain (min == max) is widened: by a decade each side on log,
 *   by half the value's magnitude (or 1 around zero) on linear, so a
 *   constant matrix draws in the middle colour; on linear it becomes [0, v]
 *   (or [v, 0] below zero), so a constant draws at the far end and an all-zero
 *   matrix at the low end of [0, 1]. null gives [1e-8, 1] on log and [0, 1]
 *   on linear (nothing to draw, but the legend stays sane).
 * @returns {{kind: string, min: number, max: number, unit: (v: number) => number}}
 *   unit(v) is in [0, 1] (clamped) for a value on the scale, NaN for one that
 *   is not (non-finite, or <= 0 on log).
 */
export function makeScale(kind, domain) {
  let min;
  let max;
  if (kind === 'log') {
    ({min, max} = domain || {min: 1e-8, max: 1});
    if (!(max > min)) {
      min /= 10;
      max *= 10;
    }
    const lmin = Math.log10(min);
    const span = Math.log10(max) - lmin;
    return {
      kind,
      min,
      max,
      unit(v) {
        if (!(v > 0) || v === Infinity) return NaN;
        const t = (Math.log10(v) - lmin) / span;
        return t < 0 ? 0 : t > 1 ? 1 : t;
      },
    };
  }
  ({min, max} = domain || {min: 0, max: 1});
  if (!(max > min)) {
    // A constant: compare it with zero, the one reference every metric here
    // has (norms, fractions and counts are all >= 0).
    if (min === 0) max = 1;
    else if (min > 0) min = 0;
    else max = 0;
  }
  const span = max - min;
  return {
    kind: 'linear',
    min,
    max,
    unit(v) {
      if (!Number.isFinite(v)) return NaN;
      const t = (v - min) / span;
      return t < 0 ? 0 : t > 1 ? 1 : t;
    },
  };
}

/** Smallest half-span of a ratio scale, in decades: x2 either side of 1. */
export const MIN_RATIO_DECADES = Math.log10(2);

/**
 * The half-span, in decades, of a ratio scale centred at 1: the largest
 * |log10(ratio)| over finite positive values, at least MIN_RATIO_DECADES
 * (so ratios that are all about 1 stay pale instead of filling both ends).
 * @param {Float64Array|number[]} values
 * @param {Uint8Array|null} missing
 * @returns {number} > 0
 */
export function ratioDecades(values, missing) {
  let m = 0;
  for (let i = 0; i < values.length; i++) {
    if (missing && missing[i]) continue;
    const v = values[i];
    if (!(v > 0) || v === Infinity) continue;
    const a = Math.abs(Math.log10(v));
    if (a > m) m = a;
  }
  return Math.max(MIN_RATIO_DECADES, m);
}

/**
 * A diverging log scale for ratios, symmetric around 1: [10^-d, 10^d].
 * It is a log scale (colorize and the legend treat it as one) that carries
 * its own LUT and special colours.
 * @param {number} decades From ratioDecades.
 * @returns {{kind: 'log', diverging: true, min, max, unit, lut, specials}}
 */
export function makeRatioScale(decades) {
  const d = decades > 0 && Number.isFinite(decades) ? decades : 1;
  const scale = makeScale('log', {min: 10 ** -d, max: 10 ** d});
  return {...scale, diverging: true, lut: RATIO_LUT, specials: RATIO_SPECIAL_COLORS};
}

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
 */
export function stepTicks(steps, stepEnds, maxTicks = 6) {
  const n = steps.length;
  if (n === 0) return [];
  const first = steps[0];
  const last = stepEnds ? stepEnds[n - 1] : steps[n - 1];
  if (last === first) return [{step: first, x: 0.5 / n}];
  const ticks = linearTicks(first, last, maxTicks).filter((v) => Number.isInteger(v));
  return ticks.map((v) => ({step: v, x: stepPosition(steps, stepEnds, v)}));
}

/**
 * Where step s falls, as a fraction of the heatmap width.
 * A column's steps are spread across its width; a step between two
 * unbinned columns (a sampled gap) interpolates between their centres.
 */
export function stepPosition(steps, stepEnds, s) {
  const n = steps.length;
  const c = columnOfStep(steps, s);
  if (c < 0) return 0;
  if (stepEnds) {
    const width = stepEnds[c] - steps[c] + 1;
    const within = Math.min(1, (s - steps[c] + 0.5) / width);
    return (c + within) / n;
  }
  if (c === n - 1 || s === steps[c]) return (c + 0.5) / n;
  return (c + 0.5 + (s - steps[c]) / (steps[c + 1] - steps[c])) / n;
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
 * @param {number[]} steps First step of each column, ascending.
 * @param {number[]|null} stepEnds Last step of each column when binned.
 * @returns {[number, number]|null} Inclusive [col0, col1], or null when no
 *   column holds a step of the range (outside the data, or in a gap).
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

/**
 * Merges highlighted cells of consecutive rows with the same columns into
 * blocks, so a finding over many layers is one outlined area.
 * @param {[number, number, number][]} cells [row, col0, col1], any order.
 * @returns {[number, number, number, number][]} [row0, row1, col0, col1].
 */
export function mergeCellRuns(cells) {
  const sorted = cells.slice().sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const out = [];
  for (const [r, c0, c1] of sorted) {
    const last = out[out.length - 1];
    if (last && last[1] + 1 === r && last[2] === c0 && last[3] === c1) last[1] = r;
    else if (last && last[1] === r && last[2] === c0 && last[3] === c1) continue;
    else out.push([r, r, c0, c1]);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Downsampling

/**
 * Edges of m near-equal bins over n items: bin i is [edges[i], edges[i+1]).
 * @returns {Int32Array} m + 1 entries, edges[0] = 0, edges[m] = n.
 */
export function binEdges(n, m) {
  const edges = new Int32Array(m + 1);
  for (let i = 0; i <= m; i++) edges[i] = Math.floor((i * n) / m);
  return edges;
}

/**
 * Downsamples a grid to at most maxCols x maxRows bins, keeping extremes: a
 * bin is the max of its finite values; any NaN in it makes it NaN, else any
 * +Infinity makes it +Infinity, else any -Infinity makes it -Infinity (a
 * non-finite cell is never hidden by its neighbours); a bin with no value at
 * all stays missing. Status (if any) keeps the worst: mismatch, then
 * inconclusive, then ok.
 * @param {{rows: number, cols: number, values: Float64Array,
 *   missing: Uint8Array, status?: Uint8Array|null}} grid
 * @param {number} maxCols
 * @param {number} maxRows
 * @returns {{rows, cols, values, missing, status, rowEdges: Int32Array,
 *   colEdges: Int32Array}} The same grid (with identity edges) when it
 *   already fits.
 */
export function downsampleGrid(grid, maxCols, maxRows) {
  const outCols = Math.max(1, Math.min(grid.cols, Math.floor(maxCols)));
  const outRows = Math.max(1, Math.min(grid.rows, Math.floor(maxRows)));
  const colEdges = binEdges(grid.cols, outCols);
  const rowEdges = binEdges(grid.rows, outRows);
  if (outCols === grid.cols && outRows === grid.rows) {
    return {...grid, status: grid.status || null, rowEdges, colEdges};
  }
  const src = grid.values;
  const srcMissing = grid.missing;
  const srcStatus = grid.status || null;
  const values = new Float64Array(outRows * outCols);
  const missing = new Uint8Array(outRows * outCols);
  const status = srcStatus ? new Uint8Array(outRows * outCols) : null;
  // Per output column: 0 = empty, 1 = has finite, 2 = -Inf, 3 = +Inf, 4 = NaN.
  const state = new Uint8Array(outCols);
  const best = new Float64Array(outCols);
  const worst = new Uint8Array(outCols);
  const statusRank = [0, 1, 3, 2]; // null < ok < inconclusive < mismatch
  const srcCols = grid.cols;
  for (let br = 0; br < outRows; br++) {
    state.fill(0);
    best.fill(-Infinity);
    worst.fill(0);
    for (let r = rowEdges[br]; r < rowEdges[br + 1]; r++) {
      const base = r * srcCols;
      for (let bc = 0; bc < outCols; bc++) {
        let st = state[bc];
        let b = best[bc];
        for (let c = colEdges[bc]; c < colEdges[bc + 1]; c++) {
          const i = base + c;
          if (srcStatus) {
            const s = srcStatus[i];
            if (statusRank[s] > statusRank[worst[bc]]) worst[bc] = s;
          }
          if (srcMissing[i]) continue;
          const v = src[i];
          if (v === v && v !== Infinity && v !== -Infinity) {
            if (st === 0) st = 1;
            if (v > b) b = v;
          } else {
            const k = v !== v ? 4 : v > 0 ? 3 : 2;
            if (k > st) st = k;
          }
        }
        state[bc] = st;
        best[bc] = b;
      }
    }
    const out = br * outCols;
    for (let bc = 0; bc < outCols; bc++) {
      const st = state[bc];
      if (st === 0) missing[out + bc] = 1;
      else if (st === 1) values[out + bc] = best[bc];
      else values[out + bc] = st === 4 ? NaN : st === 3 ? Infinity : -Infinity;
      if (status) status[out + bc] = worst[bc];
    }
  }
  return {rows: outRows, cols: outCols, values, missing, status, rowEdges, colEdges};
}

// ---------------------------------------------------------------------------
// Colouring

/**
 * Colours a grid into RGBA pixels, one per cell.
 * @param {{rows, cols, values, missing}} grid
 * @param {{kind: string, unit: Function, min: number, max: number,
 *   lut?: Uint8ClampedArray, specials?: object}} scale From makeScale or
 *   makeRatioScale; its lut and specials (if any) replace viridis and
 *   SPECIAL_COLORS.
 * @param {Uint8ClampedArray} lut Default the scale's LUT, else VIRIDIS_LUT.
 * @param {Uint8ClampedArray} [out] Reused when it has the right length.
 * @returns {Uint8ClampedArray} rows * cols * 4 bytes, row-major.
 */
export function colorize(grid, scale, lut = scale.lut || VIRIDIS_LUT, out) {
  const n = grid.rows * grid.cols;
  const px = out && out.length === n * 4 ? out : new Uint8ClampedArray(n * 4);
  const {values, missing} = grid;
  const top = LUT_SIZE - 1;
  const specials = scale.specials || SPECIAL_COLORS;
  const [mr, mg, mb] = specials.missing;
  const [nr, ng, nb] = specials.nonfinite;
  const [zr, zg, zb] = specials.zero;
  const log = scale.kind === 'log';
  // Inline the scale for speed: one log10 per cell, no closure call.
  const lmin = log ? Math.log10(scale.min) : scale.min;
  const inv = top / ((log ? Math.log10(scale.max) : scale.max) - lmin);
  for (let i = 0, p = 0; i < n; i++, p += 4) {
    px[p + 3] = 255;
    if (missing[i]) {
      px[p] = mr; px[p + 1] = mg; px[p + 2] = mb;
      continue;
    }
    const v = values[i];
    if (v !== v || v === Infinity || v === -Infinity) {
      px[p] = nr; px[p + 1] = ng; px[p + 2] = nb;
      continue;
    }
    let t;
    if (log) {
      if (!(v > 0)) {
        px[p] = zr; px[p + 1] = zg; px[p + 2] = zb;
        continue;
      }
      t = (Math.log10(v) - lmin) * inv;
    } else {
      t = (v - lmin) * inv;
    }
    const k = t <= 0 ? 0 : t >= top ? top * 4 : Math.round(t) * 4;
    px[p] = lut[k]; px[p + 1] = lut[k + 1]; px[p + 2] = lut[k + 2];
  }
  return px;
}

// ---------------------------------------------------------------------------
// Formatting and labels

/**
 * Formats a cell value for the tooltip: exact for a float32 (the shortest
 * decimal, up to 9 significant digits, that reads back as the same float32),
 * 7 significant digits for anything else, exponent notation below 1e-4 and
 * from 1e6 up.
 * @param {number|null} v
 * @returns {string} e.g. "1.2e-7", "0.0031", "NaN", "missing (no gradient)".
 */
export function formatValue(v) {
  if (v === null || v === undefined) return 'missing (no gradient)';
  if (Number.isNaN(v)) return 'NaN';
  if (v === Infinity) return 'Infinity';
  if (v === -Infinity) return '-Infinity';
  if (v === 0) return '0';
  const f = Math.fround(v);
  let p = 7;
  if (f === v) {
    for (p = 1; p < 9; p++) {
      if (Math.fround(Number(v.toPrecision(p))) === f) break;
    }
  }
  const a = Math.abs(v);
  if (a < 1e-4 || a >= 1e6) return v.toExponential(p - 1).replace(/\.?0+e/, 'e').replace('e+', 'e');
  return String(Number(v.toPrecision(p)));
}

/**
 * The prefix ending in "/" that every name shares, or "" (so labels can drop
 * it; tooltips never do). Needs at least two names, and leaves every name
 * something after the prefix.
 * @param {string[]} names
 * @returns {string}
 */
export function sharedPrefix(names) {
  if (names.length < 2) return '';
  let prefix = names[0];
  for (const name of names) {
    let i = 0;
    while (i < prefix.length && i < name.length && prefix[i] === name[i]) i++;
    prefix = prefix.slice(0, i);
    if (!prefix) return '';
  }
  const cut = prefix.lastIndexOf('/');
  if (cut < 0) return '';
  prefix = prefix.slice(0, cut + 1);
  return names.every((n) => n.length > prefix.length) ? prefix : '';
}

/**
 * Shortens a label to fit maxWidth by cutting its middle ("enc…/kernel"):
 * the end of a layer path tells layers apart, the start says where they are.
 * @param {string} text
 * @param {number} maxWidth
 * @param {(s: string) => number} measure Width of a string.
 * @returns {string} text itself when it fits.
 */
export function fitLabel(text, maxWidth, measure) {
  if (measure(text) <= maxWidth) return text;
  // Keep k characters: about 40% from the head and 60% from the tail.
  const cut = (k) => {
    const head = Math.floor(k * 0.4);
    return text.slice(0, head) + '\u2026' + text.slice(text.length - (k - head));
  };
  let lo = 0;
  let hi = text.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (measure(cut(mid)) <= maxWidth) lo = mid;
    else hi = mid - 1;
  }
  return cut(lo);
}

/**
 * Row height and heatmap height for a number of rows.
 * @param {number} rows
 * @param {number} available CSS pixels of height the view can use.
 * @param {{min?: number, max?: number, maxHeight?: number}} [opts] Row height
 *   is clamp(min=4, available / rows, max=24); the total is capped at
 *   maxHeight (default 4000) by going below min, where rows then share pixels
 *   (and get binned, keeping extremes).
 * @returns {{rowHeight: number, height: number}}
 */
export function plotHeight(rows, available, opts = {}) {
  const {min = 4, max = 24, maxHeight = 4000} = opts;
  if (rows <= 0) return {rowHeight: 0, height: 0};
  let rowHeight = Math.min(max, Math.max(min, Math.floor(available / rows)));
  if (rowHeight * rows > maxHeight) rowHeight = maxHeight / rows;
  return {rowHeight, height: Math.round(rowHeight * rows)};
}

// ---------------------------------------------------------------------------
// Canvas view (browser only)

// Smallest size, in device pixels, of a non-finite cell's mark, and the most
// cells marked that way.
const MIN_MARK = 3;
const MAX_MARKS = 5000;

/**
 * The heatmap canvas plus an overlay for hover and highlights. Drawing the
 * base image happens only on data, scale or size changes; the mouse only
 * touches the overlay.
 */
export class HeatmapCanvas {
  /**
   * @param {HTMLElement} container Positioned element the canvases fill.
   * @param {string} [id] Id of the base canvas, default "heatmap".
   */
  constructor(container, id = 'heatmap') {
    const doc = container.ownerDocument;
    this.canvas = doc.createElement('canvas');
    this.canvas.id = id;
    this.canvas.className = 'heatmap-canvas';
    this.overlay = doc.createElement('canvas');
    this.overlay.className = 'heatmap-overlay';
    container.append(this.canvas, this.overlay);
    this.offscreen = doc.createElement('canvas');
    this.grid = null;
    this.binned = null; // downsampled grid actually drawn
    this.binKey = '';
    this.pixels = null;
    this.cssWidth = 0;
    this.cssHeight = 0;
    this.hover = null;
    this.highlight = null;
    this.lastDrawMs = 0;
  }

  /** Sets the data (a grid from parseHeatmap) and the steps of its columns. */
  setData(grid, steps, stepEnds) {
    this.grid = grid;
    this.steps = steps;
    this.stepEnds = stepEnds || null;
    this.binned = null;
    this.binKey = '';
    this.hover = null;
    this.highlight = null;
  }

  /**
   * Draws the base image.
   * @param {object} scale From makeScale.
   * @param {number} cssWidth
   * @param {number} cssHeight
   * @param {number} dpr devicePixelRatio.
   * @returns {number} Milliseconds the draw took.
   */
  draw(scale, cssWidth, cssHeight, dpr) {
    const t0 = performance.now();
    const grid = this.grid;
    const pw = Math.max(1, Math.round(cssWidth * dpr));
    const ph = Math.max(1, Math.round(cssHeight * dpr));
    this.cssWidth = cssWidth;
    this.cssHeight = cssHeight;
    const ctx = sizeCanvases([this.canvas, this.overlay], pw, ph, cssWidth, cssHeight);
    if (!grid || grid.rows === 0 || grid.cols === 0) {
      this.binned = null;
      this.lastDrawMs = performance.now() - t0;
      return this.lastDrawMs;
    }
    const key = `${pw}x${ph}`;
    if (!this.binned || this.binKey !== key) {
      this.binned = downsampleGrid(grid, pw, ph);
      this.binKey = key;
    }
    const b = this.binned;
    this.pixels = colorize(b, scale, scale.lut || VIRIDIS_LUT, this.pixels);
    const off = this.offscreen;
    if (off.width !== b.cols) off.width = b.cols;
    if (off.height !== b.rows) off.height = b.rows;
    const octx = off.getContext('2d');
    octx.putImageData(new ImageData(this.pixels, b.cols, b.rows), 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, b.cols, b.rows, 0, 0, pw, ph);
    this._markNonfinite(ctx, b, pw, ph, scale.specials || SPECIAL_COLORS);
    if (b.status) this._drawMismatch(ctx, b, pw, ph);
    this.drawOverlay();
    this.lastDrawMs = performance.now() - t0;
    return this.lastDrawMs;
  }

  // A lone NaN in 10,000 steps is one device pixel wide: widen such cells to
  // MIN_MARK pixels so they can be seen. Only when there are few; many
  // non-finite cells are visible as an area anyway.
  _markNonfinite(ctx, b, pw, ph, specials) {
    const cw = pw / b.cols;
    const rh = ph / b.rows;
    if (cw >= MIN_MARK && rh >= MIN_MARK) return;
    const marks = [];
    for (let i = 0; i < b.values.length && marks.length <= MAX_MARKS; i++) {
      const v = b.values[i];
      if (!b.missing[i] && (v !== v || v === Infinity || v === -Infinity)) marks.push(i);
    }
    if (marks.length > MAX_MARKS) return;
    ctx.fillStyle = rgbCss(specials.nonfinite);
    const w = Math.max(cw, MIN_MARK);
    const h = Math.max(rh, MIN_MARK);
    for (const i of marks) {
      const r = Math.floor(i / b.cols);
      const c = i - r * b.cols;
      const x = Math.min(Math.max(0, (c + 0.5) * cw - w / 2), pw - w);
      const y = Math.min(Math.max(0, (r + 0.5) * rh - h / 2), ph - h);
      ctx.fillRect(Math.round(x), Math.round(y), Math.round(w), Math.round(h));
    }
  }

  _drawMismatch(ctx, b, pw, ph) {
    const cw = pw / b.cols;
    const rh = ph / b.rows;
    const lw = Math.max(1, Math.min(3, Math.floor(Math.min(cw, rh) / 4)));
    ctx.strokeStyle = MISMATCH_COLOR;
    ctx.lineWidth = lw;
    for (let r = 0; r < b.rows; r++) {
      for (let c = 0; c < b.cols; c++) {
        if (b.status[r * b.cols + c] !== STATUS_MISMATCH) continue;
        const x0 = Math.round(c * cw);
        const y0 = Math.round(r * rh);
        // At least 3 device pixels so a mismatch stays visible when cells are tiny.
        const w = Math.max(3, Math.round((c + 1) * cw) - x0);
        const h = Math.max(3, Math.round((r + 1) * rh) - y0);
        ctx.strokeRect(x0 + lw / 2, y0 + lw / 2, w - lw, h - lw);
      }
    }
  }

  /**
   * The drawn bin under a point in CSS pixels relative to the canvas.
   * @returns {{binRow, binCol, row0, row1, col0, col1}|null} source row and
   *   column ranges (inclusive) that the bin covers; null outside.
   */
  binAt(x, y) {
    const b = this.binned;
    if (!b || x < 0 || y < 0 || x >= this.cssWidth || y >= this.cssHeight) return null;
    const binCol = Math.min(b.cols - 1, Math.floor((x / this.cssWidth) * b.cols));
    const binRow = Math.min(b.rows - 1, Math.floor((y / this.cssHeight) * b.rows));
    return {
      binRow,
      binCol,
      row0: b.rowEdges[binRow],
      row1: b.rowEdges[binRow + 1] - 1,
      col0: b.colEdges[binCol],
      col1: b.colEdges[binCol + 1] - 1,
      value: b.missing[binRow * b.cols + binCol] ? null : b.values[binRow * b.cols + binCol],
      status: b.status ? STATUS_NAMES[b.status[binRow * b.cols + binCol]] : null,
    };
  }

  /** Sets the hovered bin (from binAt) or null, and redraws the overlay only. */
  setHover(bin) {
    this.hover = bin;
    this.drawOverlay();
  }

  /**
   * Spotlights cells, e.g. a finding's: the rest of the heatmap is washed
   * out and each highlighted run of cells is outlined.
   * @param {number[]} rowIndices Source row indices (null or [] clears).
   * @param {[number, number]|null|Array<[number, number]|null>} stepRange
   *   Inclusive [first, last] step for every row, null for every step, or
   *   an array with one such range per entry of rowIndices.
   */
  highlightCells(rowIndices, stepRange) {
    this.highlight = rowIndices && rowIndices.length ? {rows: rowIndices, stepRange} : null;
    this.drawOverlay();
  }

  /** The highlighted cells as [row, col0, col1] (source indices), or []. */
  highlightedCells() {
    if (!this.highlight || !this.grid) return [];
    const {rows, stepRange} = this.highlight;
    const perRow = Array.isArray(stepRange) && stepRange.length > 0 && (Array.isArray(stepRange[0]) || stepRange[0] === null);
    const out = [];
    rows.forEach((r, i) => {
      if (r < 0 || r >= this.grid.rows) return;
      const range = perRow ? stepRange[i] : stepRange;
      const cols = range ? columnRange(this.steps, this.stepEnds, range[0], range[1]) : [0, this.grid.cols - 1];
      if (cols) out.push([r, cols[0], cols[1]]);
    });
    return out;
  }

  drawOverlay() {
    const ov = this.overlay;
    const ctx = ov.getContext('2d');
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, ov.width, ov.height);
    const b = this.binned;
    if (!b || !this.grid) return;
    const sx = ov.width / this.grid.cols;
    const sy = ov.height / this.grid.rows;
    const blocks = mergeCellRuns(this.highlightedCells());
    if (blocks.length) {
      const rects = blocks.map(([r0, r1, c0, c1]) => {
        const x = Math.floor(c0 * sx);
        const y = Math.floor(r0 * sy);
        // At least 4 device pixels: a one-step finding in 10,000 steps must show.
        const w = Math.max(4, Math.ceil((c1 + 1) * sx) - x);
        const h = Math.max(4, Math.ceil((r1 + 1) * sy) - y);
        return [Math.max(0, Math.min(x, ov.width - w)), Math.max(0, Math.min(y, ov.height - h)), w, h];
      });
      ctx.fillStyle = 'rgba(255, 255, 255, 0.62)';
      ctx.fillRect(0, 0, ov.width, ov.height);
      for (const [x, y, w, h] of rects) ctx.clearRect(x, y, w, h);
      const lw = Math.max(1, Math.min(2, Math.floor(Math.min(sy, 8) / 3)));
      ctx.lineWidth = lw;
      ctx.strokeStyle = HIGHLIGHT_COLOR;
      for (const [x, y, w, h] of rects) ctx.strokeRect(x + lw / 2, y + lw / 2, w - lw, h - lw);
    }
    const hv = this.hover;
    if (hv) {
      const x = Math.floor(hv.col0 * sx);
      const y = Math.floor(hv.row0 * sy);
      const w = Math.max(3, Math.ceil((hv.col1 + 1) * sx) - x);
      const h = Math.max(3, Math.ceil((hv.row1 + 1) * sy) - y);
      // Faint band across the hovered row, then a two-tone outline that
      // shows on both the dark and the yellow end of the map.
      ctx.fillStyle = 'rgba(255, 255, 255, 0.12)';
      ctx.fillRect(0, y, ov.width, h);
      ctx.lineWidth = 1;
      ctx.strokeStyle = 'rgba(0, 0, 0, 0.85)';
      ctx.strokeRect(x - 1.5, y - 1.5, w + 3, h + 3);
      ctx.strokeStyle = '#ffffff';
      ctx.strokeRect(x - 0.5, y - 0.5, w + 1, h + 1);
    }
  }
}

// ---------------------------------------------------------------------------
// Trace: the rows as lines over steps, under the heatmap (browser only)

/** Above this many rows the trace draws their envelope and median, not each line. */
export const TRACE_MAX_LINES = 64;

/**
 * Per column, the min, median and max of the finite on-scale values across
 * rows (for the trace of a heatmap with many rows).
 * @param {{rows, cols, values, missing}} grid
 * @param {(v: number) => number} unit The scale's unit(); NaN = off scale.
 * @returns {{lo: Float64Array, mid: Float64Array, hi: Float64Array}} In
 *   scale units [0, 1]; NaN where a column has no value on the scale.
 */
export function traceEnvelope(grid, unit) {
  const {rows, cols, values, missing} = grid;
  const lo = new Float64Array(cols).fill(NaN);
  const mid = new Float64Array(cols).fill(NaN);
  const hi = new Float64Array(cols).fill(NaN);
  const col = [];
  for (let c = 0; c < cols; c++) {
    col.length = 0;
    for (let r = 0; r < rows; r++) {
      const i = r * cols + c;
      if (missing[i]) continue;
      const u = unit(values[i]);
      if (u === u) col.push(u);
    }
    if (!col.length) continue;
    col.sort((a, b) => a - b);
    lo[c] = col[0];
    hi[c] = col[col.length - 1];
    const m = col.length >> 1;
    mid[c] = col.length % 2 ? col[m] : (col[m - 1] + col[m]) / 2;
  }
  return {lo, mid, hi};
}

/**
 * Line chart of a heatmap's rows over its columns, on the heatmap's scale
 * (log or linear), x aligned with the heatmap's columns. The faint lines of
 * every row are drawn once per data/size change; emphasis (hovered row,
 * a finding's rows) only redraws the top canvas.
 */
export class TraceChart {
  /** @param {HTMLElement} container Positioned element the canvases fill. */
  constructor(container) {
    const doc = container.ownerDocument;
    this.base = doc.createElement('canvas');
    this.base.className = 'trace-canvas';
    this.top = doc.createElement('canvas');
    this.top.className = 'trace-canvas';
    container.append(this.base, this.top);
    this.grid = null;
    this.scale = null;
    this.dpr = 1;
    this.emphasis = [];
    this.hover = null;
  }

  _y(u, ph) {
    const pad = 4 * this.dpr;
    return pad + (1 - u) * (ph - 2 * pad);
  }

  _line(ctx, r, pw, ph) {
    const {cols, values, missing} = this.grid;
    const unit = this.scale.unit;
    const dx = pw / cols;
    let open = false;
    ctx.beginPath();
    for (let c = 0; c < cols; c++) {
      const i = r * cols + c;
      const u = missing[i] ? NaN : unit(values[i]);
      if (u !== u) {
        open = false;
        continue;
      }
      const x = (c + 0.5) * dx;
      const y = this._y(u, ph);
      if (open) ctx.lineTo(x, y);
      else {
        ctx.moveTo(x, y);
        // A lone point between gaps still shows.
        ctx.lineTo(x + 0.01, y);
      }
      open = true;
    }
    ctx.stroke();
  }

  /**
   * Draws the faint lines (or, for many rows, the envelope and median).
   * @param {object|null} grid From parseHeatmap (null clears).
   * @param {object} scale From makeScale / makeRatioScale.
   */
  draw(grid, scale, cssWidth, cssHeight, dpr) {
    this.grid = grid;
    this.scale = scale;
    this.dpr = dpr;
    const pw = Math.max(1, Math.round(cssWidth * dpr));
    const ph = Math.max(1, Math.round(cssHeight * dpr));
    const ctx = sizeCanvases([this.base, this.top], pw, ph, cssWidth, cssHeight);
    // Reference lines at the scale's ticks, drawn by the caller's axis
    // positions; here only a faint frame line at the bottom.
    ctx.fillStyle = '#eeeeee';
    ctx.fillRect(0, ph - Math.max(1, Math.round(dpr)), pw, Math.max(1, Math.round(dpr)));
    if (!grid || grid.rows === 0 || grid.cols === 0) {
      this.redrawTop();
      return;
    }
    if (grid.rows > TRACE_MAX_LINES) {
      const env = traceEnvelope(grid, scale.unit);
      const dx = pw / grid.cols;
      ctx.fillStyle = 'rgba(158, 158, 158, 0.35)';
      for (let c = 0; c < grid.cols; c++) {
        if (env.lo[c] !== env.lo[c]) continue;
        const y0 = this._y(env.hi[c], ph);
        const y1 = this._y(env.lo[c], ph);
        ctx.fillRect(Math.floor(c * dx), y0, Math.max(1, Math.ceil(dx)), Math.max(1, y1 - y0));
      }
      ctx.strokeStyle = '#757575';
      ctx.lineWidth = dpr;
      ctx.beginPath();
      let open = false;
      for (let c = 0; c < grid.cols; c++) {
        const u = env.mid[c];
        if (u !== u) {
          open = false;
          continue;
        }
        const x = (c + 0.5) * dx;
        const y = this._y(u, ph);
        if (open) ctx.lineTo(x, y);
        else ctx.moveTo(x, y);
        open = true;
      }
      ctx.stroke();
    } else {
      ctx.strokeStyle = 'rgba(117, 117, 117, 0.45)';
      ctx.lineWidth = dpr;
      ctx.lineJoin = 'round';
      for (let r = 0; r < grid.rows; r++) this._line(ctx, r, pw, ph);
    }
    this.redrawTop();
  }

  /**
   * Sets the emphasised rows and the hovered cell, redrawing the top canvas.
   * @param {{row: number, color: string}[]} emphasis Rows drawn in a colour.
   * @param {{row: number, col0: number, col1: number}|null} hover
   */
  setEmphasis(emphasis, hover) {
    this.emphasis = emphasis || [];
    this.hover = hover || null;
    this.redrawTop();
  }

  redrawTop() {
    const ctx = this.top.getContext('2d');
    const pw = this.top.width;
    const ph = this.top.height;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, pw, ph);
    const grid = this.grid;
    if (!grid || grid.rows === 0 || grid.cols === 0) return;
    ctx.lineJoin = 'round';
    // Thin enough that several emphasised rows stay apart at one step per pixel.
    ctx.lineWidth = 1.1 * this.dpr;
    for (const {row, color} of this.emphasis) {
      if (row < 0 || row >= grid.rows) continue;
      ctx.strokeStyle = color;
      this._line(ctx, row, pw, ph);
    }
    const h = this.hover;
    if (h) {
      const dx = pw / grid.cols;
      ctx.fillStyle = 'rgba(0, 0, 0, 0.06)';
      ctx.fillRect(Math.floor(h.col0 * dx), 0, Math.max(1, Math.ceil((h.col1 + 1) * dx) - Math.floor(h.col0 * dx)), ph);
      if (h.row >= 0 && h.row < grid.rows) {
        ctx.lineWidth = 1.6 * this.dpr;
        ctx.strokeStyle = '#212121';
        this._line(ctx, h.row, pw, ph);
      }
    }
  }
}
