// The heatmap canvas (DOM): one pixel per bin into ImageData, scaled without
// smoothing, plus an overlay for hover, a finding's cells and the zoom box.
// The base image is redrawn only on data, plan, scale or size changes; the
// mouse touches the overlay only.

import {columnRange, pixelColumns} from './axes.js';
import {colorize, HIGHLIGHT_COLOR, log10Grid, MISMATCH_COLOR, rgbCss, SPECIAL_COLORS, VIRIDIS_LUT} from './colour.js';
import {sizeCanvases} from './dom.js';
import {binEdges, binGrid, mergeCellRuns, planRows} from './rows.js';

// Smallest size, in device pixels, of a non-finite cell's mark, and the most
// cells marked that way (many non-finite cells are visible as an area anyway).
const MIN_MARK = 3;
const MAX_MARKS = 5000;

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
    this.plan = null;
    this.binned = null;
    this.binKey = '';
    this.pixels = null;
    this.hover = null;
    this.highlight = null;
    this.selection = null;
    this.dark = false;
    this.lastDrawMs = 0;
  }

  /**
   * Sets the data.
   * @param {object|null} grid From wire.decodeHeatmap (or wire.pickRows).
   * @param {{first, end, edges, steps, stepEnds}|null} axis axes.stepAxis of
   *   the response's steps, with the steps themselves.
   */
  setData(grid, axis) {
    this.grid = grid;
    this.axis = axis;
    this.binned = null;
    this.hover = null;
  }

  /** Sets the display rows (rows.buildPlan); source row indices refer to the grid's names. */
  setPlan(plan) {
    if (plan === this.plan) return;
    this.plan = plan;
    this.binned = null;
    this.displayOf = null;
  }

  /**
   * Draws the base image.
   * @param {object} scale From colour.makeScale or makeRatioScale.
   * @returns {number} Milliseconds the draw took.
   */
  draw(scale, cssWidth, cssHeight, dpr) {
    const t0 = performance.now();
    const pw = Math.max(1, Math.round(cssWidth * dpr));
    const ph = Math.max(1, Math.round(cssHeight * dpr));
    this.cssWidth = cssWidth;
    this.cssHeight = cssHeight;
    const ctx = sizeCanvases([this.canvas, this.overlay], pw, ph, cssWidth, cssHeight);
    const grid = this.grid;
    const rows = this.plan ? planRows(this.plan) : 0;
    if (!grid || grid.cols === 0 || rows === 0) {
      this.binned = null;
      this.lastDrawMs = performance.now() - t0;
      return this.lastDrawMs;
    }
    const outRows = Math.min(rows, ph);
    const key = `${pw}x${outRows}`;
    if (!this.binned || this.binKey !== key) {
      this.binned = binGrid(grid, this.plan, binEdges(rows, outRows), pixelColumns(this.axis.edges, pw));
      this.binKey = key;
    }
    const b = this.binned;
    if (scale.kind === 'log' && !b.log10) b.log10 = log10Grid(b);
    this.pixels = colorize(b, scale, scale.lut || VIRIDIS_LUT, this.pixels);
    const off = this.offscreen;
    if (off.width !== b.cols) off.width = b.cols;
    if (off.height !== b.rows) off.height = b.rows;
    off.getContext('2d').putImageData(new ImageData(this.pixels, b.cols, b.rows), 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, b.cols, b.rows, 0, 0, pw, ph);
    this._markNonfinite(ctx, b, pw, ph, scale.specials || SPECIAL_COLORS);
    if (b.status && grid.statusNames) this._drawMismatch(ctx, b, ph, grid.statusNames.indexOf('mismatch'));
    this.drawOverlay();
    this.lastDrawMs = performance.now() - t0;
    return this.lastDrawMs;
  }

  // A lone NaN in 10,000 steps is one device pixel wide: widen such cells to
  // MIN_MARK pixels so they can be seen.
  _markNonfinite(ctx, b, pw, ph, specials) {
    const rh = ph / b.rows;
    const marks = [];
    for (let i = 0; i < b.values.length && marks.length <= MAX_MARKS; i++) {
      const v = b.values[i];
      if (!b.missing[i] && (v !== v || v === Infinity || v === -Infinity)) marks.push(i);
    }
    if (marks.length > MAX_MARKS) return;
    ctx.fillStyle = rgbCss(specials.nonfinite);
    const h = Math.max(rh, MIN_MARK);
    for (const i of marks) {
      const r = Math.floor(i / b.cols);
      const x = Math.min(Math.max(0, i - r * b.cols - 1), pw - MIN_MARK);
      const y = Math.min(Math.max(0, (r + 0.5) * rh - h / 2), ph - h);
      ctx.fillRect(x, Math.round(y), MIN_MARK, Math.round(h));
    }
  }

  // Outlines runs of mismatching pixels, row bin by row bin.
  _drawMismatch(ctx, b, ph, code) {
    if (code < 0) return;
    const rh = ph / b.rows;
    const lw = Math.max(1, Math.min(3, Math.floor(rh / 4)));
    ctx.strokeStyle = MISMATCH_COLOR;
    ctx.lineWidth = lw;
    for (let r = 0; r < b.rows; r++) {
      let x0 = -1;
      for (let x = 0; x <= b.cols; x++) {
        const on = x < b.cols && b.status[r * b.cols + x] === code;
        if (on && x0 < 0) x0 = x;
        if (!on && x0 >= 0) {
          const y0 = Math.round(r * rh);
          const w = Math.max(3, x - x0);
          const h = Math.max(3, Math.round((r + 1) * rh) - y0);
          ctx.strokeRect(x0 + lw / 2, y0 + lw / 2, w - lw, h - lw);
          x0 = -1;
        }
      }
    }
  }

  /**
   * The drawn bin under a point in CSS pixels relative to the canvas.
   * @returns {{binRow, x, d0, d1, col0, col1, value, status}|null} display
   *   rows [d0, d1] and data columns [col0, col1] (inclusive) the bin covers.
   */
  binAt(x, y) {
    const b = this.binned;
    if (!b || x < 0 || y < 0 || x >= this.cssWidth || y >= this.cssHeight) return null;
    const px = Math.min(b.cols - 1, Math.floor((x / this.cssWidth) * b.cols));
    const binRow = Math.min(b.rows - 1, Math.floor((y / this.cssHeight) * b.rows));
    const cols = pixelColumns(this.axis.edges, b.cols);
    if (cols.start[px] < 0) return null; // a shared axis beyond this run's steps
    const i = binRow * b.cols + px;
    const code = b.status ? b.status[i] : -1;
    return {
      binRow,
      x: px,
      d0: b.rowBins[binRow],
      d1: b.rowBins[binRow + 1] - 1,
      col0: cols.start[px],
      col1: cols.end[px],
      value: b.missing[i] ? null : b.values[i],
      status: code >= 0 && this.grid.statusNames ? this.grid.statusNames[code] : null,
    };
  }

  /** Sets the hovered bin (from binAt) or null; redraws the overlay only. */
  setHover(bin) {
    this.hover = bin;
    this.drawOverlay();
  }

  /** The zoom box being dragged, in CSS pixels {x0, y0, x1, y1}, or null. */
  setSelection(box) {
    this.selection = box;
    this.drawOverlay();
  }

  /**
   * Spotlights cells (a finding's): the rest is washed out, each run of
   * highlighted cells outlined.
   * @param {number[]|null} rows Source row indices (into the grid's names).
   * @param {Array<[number, number]|null>} ranges Per row, [first, last] step or null (all).
   */
  highlightCells(rows, ranges) {
    this.highlight = rows && rows.length ? {rows, ranges} : null;
    this.drawOverlay();
  }

  _display(source) {
    if (!this.displayOf) {
      const n = this.grid ? this.grid.rowStart + this.grid.rows : 0;
      this.displayOf = new Int32Array(Math.max(n, ...this.plan.order, 0) + 1).fill(-1);
      for (let d = 0; d < planRows(this.plan); d++) {
        for (let k = this.plan.starts[d]; k < this.plan.starts[d + 1]; k++) this.displayOf[this.plan.order[k]] = d;
      }
    }
    return source < this.displayOf.length ? this.displayOf[source] : -1;
  }

  /** The highlighted cells as [display row, col0, col1], or []. */
  highlightedCells() {
    if (!this.highlight || !this.grid || !this.plan) return [];
    const out = [];
    this.highlight.rows.forEach((r, k) => {
      const d = this._display(r);
      if (d < 0) return;
      const range = this.highlight.ranges[k];
      const cols = range ? columnRange(this.axis.steps, this.axis.stepEnds, range[0], range[1]) : [0, this.grid.cols - 1];
      if (cols) out.push([d, cols[0], cols[1]]);
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
    const rows = planRows(this.plan);
    const sy = ov.height / rows;
    const edges = this.axis.edges;
    const xOf = (c) => edges[c] * ov.width;
    const blocks = mergeCellRuns(this.highlightedCells());
    if (blocks.length) {
      const rects = blocks.map(([r0, r1, c0, c1]) => {
        const x = Math.floor(xOf(c0));
        const y = Math.floor(r0 * sy);
        // At least 4 device pixels: a one-step finding in 10,000 steps must show.
        const w = Math.max(4, Math.ceil(xOf(c1 + 1)) - x);
        const h = Math.max(4, Math.ceil((r1 + 1) * sy) - y);
        return [Math.max(0, Math.min(x, ov.width - w)), Math.max(0, Math.min(y, ov.height - h)), w, h];
      });
      ctx.fillStyle = this.dark ? 'rgba(32, 32, 32, 0.66)' : 'rgba(255, 255, 255, 0.62)';
      ctx.fillRect(0, 0, ov.width, ov.height);
      for (const [x, y, w, h] of rects) ctx.clearRect(x, y, w, h);
      const lw = Math.max(1, Math.min(2, Math.floor(Math.min(sy, 8) / 3)));
      ctx.lineWidth = lw;
      ctx.strokeStyle = HIGHLIGHT_COLOR;
      for (const [x, y, w, h] of rects) ctx.strokeRect(x + lw / 2, y + lw / 2, w - lw, h - lw);
    }
    const hv = this.hover;
    if (hv) {
      const rb = ov.height / b.rows;
      const xs = ov.width / b.cols;
      const x = Math.floor(hv.x * xs);
      const y = Math.floor(hv.binRow * rb);
      const w = Math.max(3, Math.ceil(xs));
      const h = Math.max(3, Math.ceil(rb));
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
    const s = this.selection;
    if (s) {
      const k = ov.width / this.cssWidth;
      const x = Math.min(s.x0, s.x1) * k;
      const y = Math.min(s.y0, s.y1) * k;
      ctx.fillStyle = 'rgba(245, 124, 0, 0.15)';
      ctx.fillRect(x, y, Math.abs(s.x1 - s.x0) * k, Math.abs(s.y1 - s.y0) * k);
      ctx.strokeStyle = HIGHLIGHT_COLOR;
      ctx.lineWidth = 1;
      ctx.strokeRect(x + 0.5, y + 0.5, Math.abs(s.x1 - s.x0) * k, Math.abs(s.y1 - s.y0) * k);
    }
  }
}
