// The line chart under the heatmap (DOM): every display row as a line over
// the same step axis, on the heatmap's scale; above 64 rows, their envelope
// and median. Its caption is a line of text above the plot area (views.js),
// never drawn over the data.

import {sizeCanvases} from './dom.js';

/** Above this many rows the chart draws their envelope and median, not each line. */
export const MAX_LINES = 64;

/**
 * Per column, the min, median and max of the values on a scale, across rows,
 * in value units: order statistics do not change under the scale's monotonic
 * map, so the envelope is computed once per scale kind, not per redraw.
 * @param {{rows, cols, values, missing}} grid
 * @param {'log'|'linear'} kind Log takes finite values > 0; linear every finite value.
 * @returns {{lo: Float64Array, mid: Float64Array, hi: Float64Array}} NaN
 *   where a column has no value on the scale.
 */
export function envelope(grid, kind) {
  const {rows, cols, values, missing} = grid;
  const lo = new Float64Array(cols).fill(NaN);
  const mid = new Float64Array(cols).fill(NaN);
  const hi = new Float64Array(cols).fill(NaN);
  const log = kind === 'log';
  // Columns in blocks: each row is read as a contiguous run of BLOCK values
  // (a column-at-a-time gather would jump a whole row between reads).
  const BLOCK = 32;
  const buf = new Float64Array(BLOCK * rows);
  const count = new Int32Array(BLOCK);
  for (let c0 = 0; c0 < cols; c0 += BLOCK) {
    const w = Math.min(BLOCK, cols - c0);
    count.fill(0);
    for (let r = 0; r < rows; r++) {
      const base = r * cols + c0;
      for (let b = 0; b < w; b++) {
        const i = base + b;
        const v = values[i];
        if (missing[i] || v !== v || v === Infinity || v === -Infinity || (log && !(v > 0))) continue;
        buf[b * rows + count[b]++] = v;
      }
    }
    for (let b = 0; b < w; b++) {
      const k = count[b];
      if (!k) continue;
      const col = buf.subarray(b * rows, b * rows + k);
      let a = Infinity;
      let z = -Infinity;
      for (let j = 0; j < k; j++) {
        if (col[j] < a) a = col[j];
        if (col[j] > z) z = col[j];
      }
      const c = c0 + b;
      lo[c] = a;
      hi[c] = z;
      const m = k >> 1;
      const upper = select(col, k, m);
      if (k % 2) mid[c] = upper;
      else {
        // After the select, col[0..m) holds the m smallest: the lower middle is their max.
        let lower = -Infinity;
        for (let j = 0; j < m; j++) if (col[j] > lower) lower = col[j];
        mid[c] = (lower + upper) / 2;
      }
    }
  }
  return {lo, mid, hi};
}

// The k-th smallest of a[0..n) (Hoare's quickselect, reorders a): a median
// in linear time, where sorting 2,000 rows for each of 1,200 columns is not.
function select(a, n, k) {
  let left = 0;
  let right = n - 1;
  while (right > left) {
    const pivot = a[(left + right) >> 1];
    let i = left;
    let j = right;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) {
        const t = a[i];
        a[i] = a[j];
        a[j] = t;
        i++;
        j--;
      }
    }
    if (k <= j) right = j;
    else if (k >= i) left = i;
    else return a[k];
  }
  return a[k];
}

// Room above the highest and below the lowest value, in CSS pixels: a line
// at the top of the scale is drawn whole, not cut by the frame.
export const PAD = 6;

export class LineChart {
  /** @param {HTMLElement} container Positioned element the canvases fill. */
  constructor(container) {
    const doc = container.ownerDocument;
    this.base = doc.createElement('canvas');
    this.base.className = 'trace-canvas';
    this.top = doc.createElement('canvas');
    this.top.className = 'trace-canvas';
    container.append(this.base, this.top);
    this.grid = null;
    this.emphasis = [];
    this.hover = null;
    this.dark = false;
  }

  _y(u, ph) {
    const pad = PAD * this.dpr;
    return pad + (1 - u) * (ph - 2 * pad);
  }

  _x(c, pw) {
    const e = this.edges;
    return ((e[c] + e[c + 1]) / 2) * pw;
  }

  _line(ctx, r, pw, ph) {
    const {cols, values, missing} = this.grid;
    const unit = this.scale.unit;
    let open = false;
    ctx.beginPath();
    for (let c = 0; c < cols; c++) {
      const i = r * cols + c;
      const u = missing[i] ? NaN : unit(values[i]);
      if (u !== u) {
        open = false;
        continue;
      }
      const x = this._x(c, pw);
      const y = this._y(u, ph);
      if (open) ctx.lineTo(x, y);
      else {
        ctx.moveTo(x, y);
        ctx.lineTo(x + 0.01, y); // a lone point between gaps still shows
      }
      open = true;
    }
    ctx.stroke();
  }

  /**
   * Draws the faint lines (or the envelope and median).
   * @param {object|null} grid Display rows x data columns (null clears).
   * @param {Float64Array} edges Column edges (axes.stepAxis).
   * @param {object} scale From colour.makeScale / makeRatioScale.
   */
  draw(grid, edges, scale, cssWidth, cssHeight, dpr) {
    this.grid = grid;
    this.edges = edges;
    this.scale = scale;
    this.dpr = dpr;
    const pw = Math.max(1, Math.round(cssWidth * dpr));
    const ph = Math.max(1, Math.round(cssHeight * dpr));
    const ctx = sizeCanvases([this.base, this.top], pw, ph, cssWidth, cssHeight);
    const grey = this.dark ? 'rgba(189, 189, 189, ' : 'rgba(117, 117, 117, ';
    ctx.fillStyle = this.dark ? '#555555' : '#eeeeee';
    ctx.fillRect(0, ph - Math.max(1, Math.round(dpr)), pw, Math.max(1, Math.round(dpr)));
    if (!grid || grid.rows === 0 || grid.cols === 0) {
      this.redrawTop();
      return;
    }
    if (grid.rows > MAX_LINES) {
      const kind = scale.kind === 'log' ? 'log' : 'linear';
      if (!this.env || this.envGrid !== grid || this.envKind !== kind) {
        this.env = envelope(grid, kind);
        this.envGrid = grid;
        this.envKind = kind;
      }
      const u = scale.unit;
      const env = {lo: this.env.lo.map(u), mid: this.env.mid.map(u), hi: this.env.hi.map(u)};
      ctx.fillStyle = `${grey}0.35)`;
      for (let c = 0; c < grid.cols; c++) {
        if (env.lo[c] !== env.lo[c]) continue;
        const x0 = Math.floor(edges[c] * pw);
        const y0 = this._y(env.hi[c], ph);
        const y1 = this._y(env.lo[c], ph);
        // Columns abut without overlapping: an overlap would double the alpha into stripes.
        ctx.fillRect(x0, y0, Math.max(1, Math.floor(edges[c + 1] * pw) - x0), Math.max(1, y1 - y0));
      }
      ctx.strokeStyle = `${grey}1)`;
      ctx.lineWidth = dpr;
      ctx.beginPath();
      let open = false;
      for (let c = 0; c < grid.cols; c++) {
        const u = env.mid[c];
        if (u !== u) {
          open = false;
          continue;
        }
        if (open) ctx.lineTo(this._x(c, pw), this._y(u, ph));
        else ctx.moveTo(this._x(c, pw), this._y(u, ph));
        open = true;
      }
      ctx.stroke();
    } else {
      ctx.strokeStyle = `${grey}0.45)`;
      ctx.lineWidth = dpr;
      ctx.lineJoin = 'round';
      for (let r = 0; r < grid.rows; r++) this._line(ctx, r, pw, ph);
    }
    this.redrawTop();
  }

  /**
   * Sets the emphasised rows and the hovered cell; redraws the top canvas only.
   * @param {{row: number, color: string}[]} emphasis Display rows drawn in a colour.
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
    ctx.lineWidth = 1.1 * this.dpr;
    for (const {row, color} of this.emphasis) {
      if (row < 0 || row >= grid.rows) continue;
      ctx.strokeStyle = color;
      this._line(ctx, row, pw, ph);
    }
    const h = this.hover;
    if (h) {
      const x0 = Math.floor(this.edges[h.col0] * pw);
      ctx.fillStyle = this.dark ? 'rgba(255, 255, 255, 0.08)' : 'rgba(0, 0, 0, 0.06)';
      ctx.fillRect(x0, 0, Math.max(1, Math.ceil(this.edges[h.col1 + 1] * pw) - x0), ph);
      if (h.row >= 0 && h.row < grid.rows) {
        ctx.lineWidth = 1.6 * this.dpr;
        ctx.strokeStyle = this.dark ? '#fafafa' : '#212121';
        this._line(ctx, h.row, pw, ph);
      }
    }
  }
}
