// Colour for the Gradients tab (pure; tested under node): the 256-entry
// lookup tables, the colours of cells that are not on a scale, the value
// scales (log, linear, diverging ratio) and colouring a grid into RGBA pixels.

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
// Colouring

/**
 * log10 of every cell of a grid (NaN where not positive), for colorize to
 * reuse across redraws.
 * @returns {Float32Array}
 */
export function log10Grid(grid) {
  const out = new Float32Array(grid.values.length);
  for (let i = 0; i < out.length; i++) {
    const v = grid.values[i];
    out[i] = v > 0 ? Math.log10(v) : NaN;
  }
  return out;
}

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
  // grid.log10 (from log10Grid), when present, spares one log10 per cell
  // on every redraw of the same bins.
  const logs = log ? grid.log10 || null : null;
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
      t = ((logs ? logs[i] : Math.log10(v)) - lmin) * inv;
    } else {
      t = (v - lmin) * inv;
    }
    const k = t <= 0 ? 0 : t >= top ? top * 4 : Math.round(t) * 4;
    px[p] = lut[k]; px[p + 1] = lut[k + 1]; px[p + 2] = lut[k + 2];
  }
  return px;
}
