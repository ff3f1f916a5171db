// Painting the tab from its state (DOM): plot sizes, both heatmaps, row
// labels and marks, the line chart and its caption, legend, status line, row
// bar and the alignment note. Reads the state, never changes it: paint()
// answers what it drew, and the controller keeps that (state.takePaint).
// What the paint says is decided in scene.js.

import {stepTicks} from './axes.js';
import {LineChart} from './chart.js';
import {makeRatioScale, makeScale, ratioDecades, valueDomain} from './colour.js';
import {ownLabels} from './compare.js';
import {setSegmented} from './controls.js';
import {makeMeasure} from './dom.js';
import {findingCells, kindLabel, rowMarks} from './findings.js';
import {allZeroText, ratioMetricEnds} from './format.js';
import {HeatmapCanvas} from './heatmap.js';
import {binEdges, binGrid, fitHeight, planRows, sharedPrefix} from './rows.js';
import {alignNoteLines, chartCaption, displayAbsent, legendOptions, noDataText, plotTitles, zoomNote} from './scene.js';
import {statusParts} from './selection.js';
import {activeFinding, compareMode, currentScale, runInfo} from './state.js';
import {labelColumnWidth, markAbsentRows, renderLegend, renderRowLabels, renderRowMarks, renderStatus, renderTraceAxis, renderXAxis} from './views.js';

const CHART = {min: 110, max: 220, caption: 22};
const BOTTOM_ROOM = 48; // x axis and a margin under the last plot
const SEVERITY_COLORS = {error: 'rgba(211, 47, 47, 0.9)', warning: 'rgba(239, 143, 0, 0.9)', info: 'rgba(96, 125, 139, 0.9)'};

// Value ranges per decoded grid and scale kind: a redraw (scale toggle,
// resize, a finding clicked) must not walk 2,000 x 1,200 cells again.
const DOMAINS = new WeakMap();
// The chart's lines per decoded grid: {plan, series}, rebinned when the plan changes.
const SERIES = new WeakMap();

function domainOf(grid, kind) {
  let cache = DOMAINS.get(grid);
  if (!cache) DOMAINS.set(grid, (cache = {}));
  if (!(kind in cache)) cache[kind] = valueDomain(grid.values, grid.missing, kind);
  return cache[kind];
}

function unionDomain(grids, kind) {
  let out = null;
  for (const g of grids) {
    const d = domainOf(g, kind);
    if (d) out = out ? {min: Math.min(out.min, d.min), max: Math.max(out.max, d.max)} : d;
  }
  return out;
}

/**
 * The tab's view: what paint draws into.
 * @typedef {{doc: Document, ui: object, chart: object, measure: Function,
 *   panes: {main: {plot: object, heat: object}, other: {plot: object, heat: object}}}} View
 *   ui from controls.buildLayout; chart a chart.LineChart; panes each
 *   plot's elements (views.buildPlot) and its heatmap.HeatmapCanvas.
 */

/**
 * Makes the view of a tab built by controls.buildLayout: both plots'
 * heatmap canvases, the chart, a label measurer.
 * @returns {View}
 */
export function makeView(doc, ui) {
  return {
    doc, ui, measure: makeMeasure(doc), chart: new LineChart(ui.plot.traceWrap),
    panes: {
      main: {plot: ui.plot, heat: new HeatmapCanvas(ui.plot.canvasWrap, 'heatmap')},
      other: {plot: ui.otherPlot, heat: new HeatmapCanvas(ui.otherPlot.canvasWrap, 'heatmap-other')},
    },
  };
}

function layoutOf(view, st, mode) {
  const {doc, ui, measure} = view;
  const total = ui.plot.root.clientWidth || doc.documentElement.clientWidth - 32;
  const prefix = sharedPrefix(st.names);
  const labelWidth = labelColumnWidth(st.names.slice(0, 400).map((n) => n.slice(prefix.length)), measure,
    Math.min(280, Math.max(110, total * 0.3)));
  const width = Math.max(50, total - labelWidth - 8);
  const top = ui.plot.canvasWrap.getBoundingClientRect().top + window.scrollY || 160;
  let available = Math.max(140, window.innerHeight - top - BOTTOM_ROOM);
  const rows = planRows(st.plan);
  const chartOn = mode !== 'side';
  const traceHeight = chartOn ? Math.round(Math.min(CHART.max, Math.max(CHART.min, available * 0.25))) : 0;
  available -= chartOn ? traceHeight + CHART.caption : 0;
  if (mode === 'side') available = Math.max(80, (available - 70) / 2);
  return {prefix, labelWidth, width, traceHeight, ...fitHeight(rows, Math.max(80, available))};
}

// The colour scale of the grids shown, and whether every value is 0.
function colourScale(st, mode, grids) {
  let domain = unionDomain(grids, 'linear');
  // Every value 0 (no NaN on a healthy run, no exact zeros): say so
  // instead of painting a black block under a log scale.
  const allZero = mode !== 'ratio' && domain !== null && domain.min === 0 && domain.max === 0;
  let scale;
  if (mode === 'ratio') scale = makeRatioScale(ratioDecades(grids[0].values, grids[0].missing));
  else {
    domain = unionDomain(grids, currentScale(st));
    // A ratio metric (before-clip / applied) reads best around 1, on the diverging scale.
    scale = ratioMetricEnds(st.main.resp.metric)
      ? makeRatioScale(Math.max(...grids.map((g) => ratioDecades(g.values, g.missing))))
      : makeScale(currentScale(st), domain);
  }
  return {scale, domain, allZero};
}

// One plot: its box, labels, heatmap and x axis. Returns whether the heatmap was drawn.
function paintPlot(view, st, key, painted) {
  const {plot, heat} = view.panes[key];
  const pane = st[key];
  const {layout: L, allZero} = painted;
  const empty = pane.grid.cols === 0 || planRows(st.plan) === 0;
  plot.root.style.setProperty('--label-width', `${L.labelWidth}px`);
  plot.canvasWrap.style.height = `${empty || allZero ? 64 : L.height}px`;
  plot.noData.hidden = !empty;
  plot.noData.textContent = noDataText(pane.grid.cols);
  plot.allZero.hidden = empty || !allZero;
  plot.allZero.textContent = allZero ? allZeroText(pane.resp.metric) : '';
  heat.canvas.hidden = heat.overlay.hidden = empty || allZero;
  heat.setPlan(st.plan);
  // Side by side, the compared run's rows go by its own names (its
  // prefix, its groups' keys); the rows themselves are the aligned ones.
  const own = key === 'other' && st.otherNames ? ownLabels(st.plan, st.groups, st.names, st.otherNames, st.rows.collapsed, (pane.resp && pane.resp.labels) || {}) : null;
  const prefix = own ? sharedPrefix(own.names) : L.prefix;
  if (key === 'other') painted.otherLabels = own ? own.labels : null;
  plot.prefix.textContent = prefix;
  renderRowLabels(plot.labels, st.plan, {names: st.names, groups: st.groups, prefix,
    rowHeight: allZero || empty ? 0 : L.rowHeight, width: L.labelWidth, measure: view.measure, collapsed: st.rows.collapsed,
    labels: own ? own.labels : null, groupKeys: own ? own.groupKeys : null});
  const drawn = !empty && !allZero;
  if (drawn) heat.draw(painted.scale, L.width, L.height, window.devicePixelRatio || 1);
  renderXAxis(plot.xAxis, empty ? [] : stepTicks(pane.axis, Math.max(2, Math.floor(L.width / 90))), L.width);
  markAbsentRows(plot.labels, pane.grid.absent ? displayAbsent(st.plan, pane.grid.absent) : null, pane.run);
  return drawn;
}

/**
 * Paints the state: both plots, the chart, marks, titles, legend, status and
 * row bar.
 * @param {View} view
 * @param {object} st The tab's state (read only).
 * @returns {object|null} What was drawn (the shape of state.painted), or
 *   null when there is nothing to draw yet.
 */
export function paint(view, st) {
  if (!st.main.grid || !st.plan) return null;
  const t0 = performance.now();
  const ui = view.ui;
  const mode = compareMode(st);
  const side = mode === 'side' && !!st.other.grid;
  const {scale, domain, allZero} = colourScale(st, mode, (side ? [st.main, st.other] : [st.main]).map((p) => p.grid));
  const painted = {layout: layoutOf(view, st, mode), scale, allZero, drawn: false, otherLabels: null, ms: 0};
  let anyDrawn = false;
  for (const key of ['main', 'other']) {
    const on = key === 'main' || side;
    view.panes[key].plot.root.hidden = !on;
    if (on) anyDrawn = paintPlot(view, st, key, painted) || anyDrawn;
  }
  drawChart(view, st, mode, anyDrawn && domain !== null, painted);
  applyMarks(view, st, painted);
  const titles = plotTitles(mode, side, st.sel.run, st.compare.other);
  ui.plotTitle.hidden = !mode;
  ui.otherBox.hidden = !side;
  ui.plotTitle.textContent = titles.main;
  ui.otherTitle.textContent = titles.other;
  renderLegend(ui.legend, scale, legendOptions({
    metric: st.main.resp.metric, mode, side, scale, scaleKind: currentScale(st), noScale: !anyDrawn || domain === null,
    hasStatus: !!st.main.grid.status, run: st.sel.run, other: st.compare.other,
  }));
  const binned = view.panes.main.heat.binned;
  const shownRows = planRows(st.plan);
  renderStatus(ui.status, statusParts(runInfo(st), st.main.resp, {
    rows: st.names.length, shownRows, pixelRows: binned ? binned.rows : shownRows,
  }));
  renderRowbar(ui.rowbar, st);
  painted.drawn = anyDrawn;
  highlightActive(view, st);
  painted.ms = performance.now() - t0; // the whole repaint: canvases, labels, chart, legend
  return painted;
}

// The chart: one line per display row (a collapsed block is its max).
function drawChart(view, st, mode, on, painted) {
  const ui = view.ui;
  const show = on && mode !== 'side' && !painted.allZero;
  for (const n of [ui.plot.traceWrap, ui.plot.traceAxis, ui.plot.traceCaption]) n.hidden = !show;
  if (!show) return;
  const L = painted.layout;
  const grid = st.main.grid;
  let cached = SERIES.get(grid);
  if (!cached || cached.plan !== st.plan) {
    const rows = planRows(st.plan);
    const identity = {start: Int32Array.from({length: grid.cols}, (_, c) => c), end: Int32Array.from({length: grid.cols}, (_, c) => c)};
    cached = {plan: st.plan, series: binGrid(grid, st.plan, binEdges(rows, rows), identity)};
    SERIES.set(grid, cached);
  }
  ui.plot.traceWrap.style.height = `${L.traceHeight}px`;
  view.chart.draw(cached.series, st.main.axis.edges, painted.scale, L.width, L.traceHeight, window.devicePixelRatio || 1);
  renderTraceAxis(ui.plot.traceAxis, painted.scale, L.traceHeight, false);
  updateChart(view, st, null);
}

/**
 * The chart's emphasis (the spotlighted finding's rows, the hovered row) and caption.
 * @param {View} view
 * @param {object} st
 * @param {{d0, d1, col0, col1}|null} bin The bin under the pointer on the main plot.
 */
export function updateChart(view, st, bin) {
  const ui = view.ui;
  if (ui.plot.traceWrap.hidden || !SERIES.has(st.main.grid)) return;
  const f = activeFinding(st);
  const emphasis = [];
  if (f && st.findings.run === st.sel.run) {
    const color = SEVERITY_COLORS[f.severity] || SEVERITY_COLORS.warning;
    const seen = new Set();
    for (const r of findingCells(f, st.names).rows) {
      const d = view.panes.main.heat._display(r);
      if (d >= 0 && !seen.has(d)) emphasis.push({row: d, color}) && seen.add(d);
    }
  }
  const one = bin && bin.d0 === bin.d1;
  view.chart.setEmphasis(emphasis, bin ? {row: one ? bin.d0 : -1, col0: bin.col0, col1: bin.col1} : null);
  ui.plot.traceCaption.textContent = chartCaption({
    hovered: one ? st.plan.labels[bin.d0] : null,
    what: compareMode(st) === 'ratio' ? 'ratio' : st.main.resp.metric,
    noun: st.main.resp.granularity === 'variable' ? 'variable' : 'layer',
    rows: planRows(st.plan), emphasised: emphasis.length, kind: emphasis.length ? kindLabel(f) : '',
  });
}

function renderRowbar(rb, st) {
  rb.collapseAll.hidden = rb.expandAll.hidden = st.groups.length === 0;
  rb.expandAll.disabled = st.rows.collapsed.size === 0;
  const z = st.rows.zoom;
  rb.zoomNote.hidden = rb.resetZoom.hidden = !z;
  if (z) rb.zoomNote.textContent = zoomNote(z);
}

/**
 * Marks the rows findings name, beside the main plot's labels (none on a ratio).
 * @param {View} view
 * @param {object} st
 * @param {object} [painted] The paint the marks go with (default the last kept).
 */
export function applyMarks(view, st, painted = st.painted) {
  const list = st.findings.run === (st.sel && st.sel.run) && compareMode(st) !== 'ratio' ? st.findings.list || [] : [];
  const byDisplay = new Map();
  for (const m of rowMarks(list, st.names)) {
    const d = view.panes.main.heat._display(m.row);
    if (d < 0) continue;
    const prev = byDisplay.get(d);
    if (!prev || m.severity === 'error') byDisplay.set(d, {...m, row: d});
  }
  const rh = painted.allZero ? 0 : painted.layout.rowHeight;
  renderRowMarks(view.panes.main.plot.marks, [...byDisplay.values()], rh, planRows(st.plan));
  renderRowMarks(view.panes.other.plot.marks, [], rh, planRows(st.plan));
}

/** Outlines the spotlighted finding's cells on the main heatmap (none on a ratio), and its rows on the chart. */
export function highlightActive(view, st) {
  const f = activeFinding(st);
  const {main, other} = view.panes;
  other.heat.highlightCells(null);
  if (!f || !st.main.grid || st.findings.run !== st.sel.run || compareMode(st) === 'ratio') {
    main.heat.highlightCells(null);
  } else {
    const cells = findingCells(f, st.names);
    main.heat.highlightCells(cells.rows, cells.ranges);
  }
  updateChart(view, st, null);
}

/** The note under the controls that says which alignment a comparison uses, and the pressed button. */
export function renderAlignNote(view, st, mode) {
  const ui = view.ui;
  if (mode && st.alignment) setSegmented(ui.align, st.alignment.mode);
  const lines = mode ? alignNoteLines(st.alignment, st.onlyIn, st.names.length, st.sel.run, st.compare.other) : [];
  ui.alignNote.hidden = lines.length === 0;
  ui.alignNote.replaceChildren(...lines.map((t) => Object.assign(view.doc.createElement('div'), {textContent: t})));
}
