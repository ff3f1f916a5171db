// Painting the tab from the controller's state (DOM): plot sizes, both
// heatmaps, row labels and marks, the line chart and its caption, legend,
// status line, row bar and the alignment note. Reads the state, never
// changes the selection; index.js calls it after every change.

import {stepTicks} from './axes.js';
import {makeRatioScale, makeScale, ratioDecades, valueDomain} from './colour.js';
import {alignmentText, ownLabels} from './compare.js';
import {setSegmented} from './controls.js';
import {findingCells, kindLabel, rowMarks} from './findings.js';
import {allZeroText, metricLabel, ratioMetricEnds, stepRangeText} from './format.js';
import {binEdges, binGrid, fitHeight, planRows, sharedPrefix, sourceRows} from './rows.js';
import {statusParts} from './selection.js';
import {labelColumnWidth, markAbsentRows, renderLegend, renderRowLabels, renderRowMarks, renderStatus, renderTraceAxis, renderXAxis} from './views.js';

const CHART = {min: 110, max: 220, caption: 22};
const BOTTOM_ROOM = 48; // x axis and a margin under the last plot
const SEVERITY_COLORS = {error: 'rgba(211, 47, 47, 0.9)', warning: 'rgba(239, 143, 0, 0.9)', info: 'rgba(96, 125, 139, 0.9)'};

// Value ranges per decoded grid and scale kind: a redraw (scale toggle,
// resize, a finding clicked) must not walk 2,000 x 1,200 cells again.
const DOMAINS = new WeakMap();

function domainOf(grid, kind) {
  let cache = DOMAINS.get(grid);
  if (!cache) DOMAINS.set(grid, (cache = {}));
  if (!(kind in cache)) cache[kind] = valueDomain(grid.values, grid.missing, kind);
  return cache[kind];
}

/**
 * @param {object} env {doc, ui, st, main, other, chart, measure,
 *   compareMode(), info(), activeFinding(), setReady(ready)}
 * @returns {{draw, updateChart, applyMarks, highlightActive, renderAlignNote}}
 */
export function makePainter(env) {
  const {doc, ui, st, main, other, chart, measure, compareMode, info, activeFinding, setReady} = env;


  function layout(mode) {
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

  function draw() {
    if (!main.grid || !st.plan) return;
    const t0 = performance.now();
    const mode = compareMode();
    const side = mode === 'side' && !!other.grid;
    const L = (st.layout = layout(mode));
    const dpr = window.devicePixelRatio || 1;
    const shown = side ? [main, other] : [main];
    let domain = null;
    for (const p of shown) {
      const d = domainOf(p.grid, 'linear');
      if (d) domain = domain ? {min: Math.min(domain.min, d.min), max: Math.max(domain.max, d.max)} : d;
    }
    // Every value 0 (no NaN on a healthy run, no exact zeros): say so
    // instead of painting a black block under a log scale.
    st.allZero = mode !== 'ratio' && domain !== null && domain.min === 0 && domain.max === 0;
    let scale;
    if (mode === 'ratio') scale = makeRatioScale(ratioDecades(main.grid.values, main.grid.missing));
    else {
      let d = null;
      for (const p of shown) {
        const x = domainOf(p.grid, st.scale);
        if (x) d = d ? {min: Math.min(d.min, x.min), max: Math.max(d.max, x.max)} : x;
      }
      // A ratio metric (before-clip / applied) reads best around 1, on the diverging scale.
      scale = ratioMetricEnds(main.resp.metric)
        ? makeRatioScale(Math.max(...shown.map((p) => ratioDecades(p.grid.values, p.grid.missing))))
        : makeScale(st.scale, d);
      domain = d;
    }
    st.scaleObj = scale;
    let anyDrawn = false;
    for (const p of [main, other]) {
      const on = p === main || side;
      p.plot.root.hidden = !on;
      if (!on) continue;
      const empty = p.grid.cols === 0 || planRows(st.plan) === 0;
      p.plot.root.style.setProperty('--label-width', `${L.labelWidth}px`);
      p.plot.canvasWrap.style.height = `${empty || st.allZero ? 64 : L.height}px`;
      p.plot.noData.hidden = !empty;
      p.plot.noData.textContent = p.grid.cols === 0 ? 'No steps recorded yet for this selection.' : 'No row matches the filter.';
      p.plot.allZero.hidden = empty || !st.allZero;
      p.plot.allZero.textContent = st.allZero ? allZeroText(p.resp.metric) : '';
      p.heat.canvas.hidden = p.heat.overlay.hidden = empty || st.allZero;
      p.heat.setPlan(st.plan);
      // Side by side, the compared run's rows go by its own names (its
      // prefix, its groups' keys); the rows themselves are the aligned ones.
      const own = p === other && other.names ? ownLabels(st.plan, st.groups, st.names, other.names, st.rows.collapsed) : null;
      const prefix = own ? sharedPrefix(own.names) : L.prefix;
      p.labels = own ? own.labels : null;
      p.plot.prefix.textContent = prefix;
      renderRowLabels(p.plot.labels, st.plan, {names: st.names, groups: st.groups, prefix,
        rowHeight: st.allZero || empty ? 0 : L.rowHeight, width: L.labelWidth, measure, collapsed: st.rows.collapsed,
        labels: own ? own.labels : null, groupKeys: own ? own.groupKeys : null});
      if (!empty && !st.allZero) {
        p.heat.draw(scale, L.width, L.height, dpr);
        anyDrawn = true;
      }
      renderXAxis(p.plot.xAxis, empty ? [] : stepTicks(p.axis, Math.max(2, Math.floor(L.width / 90))), L.width);
      markAbsentRows(p.plot.labels, p.grid.absent ? displayAbsent(p.grid.absent) : null, p.run);
    }
    drawChart(mode, anyDrawn && domain !== null);
    applyMarks();
    ui.plotTitle.hidden = !mode;
    ui.otherBox.hidden = !side;
    ui.plotTitle.textContent = mode === 'ratio' ? `${st.sel.run} \u00f7 ${st.compare.other}` : mode ? st.sel.run : '';
    ui.otherTitle.textContent = side ? st.compare.other : '';
    const metric = metricLabel(main.resp.metric);
    const ends = ratioMetricEnds(main.resp.metric);
    renderLegend(ui.legend, scale, mode !== 'ratio' && ends ? {
      title: `${metric}${side ? ', both runs' : ''}`, showZero: true,
      noScale: !anyDrawn || domain === null, specials: scale.specials,
      specialLabels: {nonfinite: 'NaN / Inf', missing: 'no value', zero: '0'},
      lowLabel: ends.low, highLabel: ends.high,
    } : mode === 'ratio' ? {
      title: `ratio ${st.sel.run} \u00f7 ${st.compare.other}, ${main.resp.metric}`, showZero: true,
      noScale: !anyDrawn || domain === null, specials: scale.specials,
      specialLabels: {nonfinite: 'NaN / \u00f7 0', missing: 'no value', zero: '0'},
      lowLabel: `${st.compare.other} larger`, highLabel: `${st.sel.run} larger`,
    } : {
      title: `${metric}${st.scale === 'log' ? ', log' : ''}${side ? ', both runs' : ''}`,
      showZero: st.scale === 'log', showMismatch: !!main.grid.status, noScale: !anyDrawn || domain === null,
    });
    const binned = main.heat.binned;
    renderStatus(ui.status, statusParts(info(), main.resp, {
      rows: st.names.length, shownRows: planRows(st.plan), pixelRows: binned ? binned.rows : planRows(st.plan),
    }));
    renderRowbar();
    st.drawn = anyDrawn;
    highlightActive();
    st.lastPaintMs = performance.now() - t0; // the whole repaint: canvases, labels, chart, legend
    setReady(true);
  }

  function displayAbsent(absent) {
    const out = new Uint8Array(planRows(st.plan));
    for (let d = 0; d < out.length; d++) {
      out[d] = sourceRows(st.plan, d, d).every((s) => absent[s]) ? 1 : 0;
    }
    return out;
  }

  // The chart: one line per display row (a collapsed block is its max).
  function drawChart(mode, on) {
    const show = on && mode !== 'side' && !st.allZero;
    for (const n of [ui.plot.traceWrap, ui.plot.traceAxis, ui.plot.traceCaption]) n.hidden = !show;
    if (!show) return;
    const L = st.layout;
    const rows = planRows(st.plan);
    const cols = main.grid.cols;
    if (!main.series || main.seriesOf !== main.grid || main.seriesPlan !== st.plan) {
      const identity = {start: Int32Array.from({length: cols}, (_, c) => c), end: Int32Array.from({length: cols}, (_, c) => c)};
      main.series = binGrid(main.grid, st.plan, binEdges(rows, rows), identity);
      main.seriesOf = main.grid;
      main.seriesPlan = st.plan;
    }
    ui.plot.traceWrap.style.height = `${L.traceHeight}px`;
    chart.draw(main.series, main.axis.edges, st.scaleObj, L.width, L.traceHeight, window.devicePixelRatio || 1);
    renderTraceAxis(ui.plot.traceAxis, st.scaleObj, L.traceHeight, false);
    updateChart(null);
  }

  function updateChart(bin) {
    if (ui.plot.traceWrap.hidden || !main.series) return;
    const f = activeFinding();
    const emphasis = [];
    if (f && st.findings.run === st.sel.run) {
      const color = SEVERITY_COLORS[f.severity] || SEVERITY_COLORS.warning;
      const seen = new Set();
      for (const r of findingCells(f, st.names).rows) {
        const d = main.heat._display(r);
        if (d >= 0 && !seen.has(d)) emphasis.push({row: d, color}) && seen.add(d);
      }
    }
    chart.setEmphasis(emphasis, bin ? {row: bin.d0 === bin.d1 ? bin.d0 : -1, col0: bin.col0, col1: bin.col1} : null);
    const what = compareMode() === 'ratio' ? 'ratio' : main.resp.metric;
    const noun = main.resp.granularity === 'variable' ? 'variable' : 'layer';
    const n = planRows(st.plan);
    const cap = ui.plot.traceCaption;
    if (bin && bin.d0 === bin.d1) cap.textContent = `${st.plan.labels[bin.d0]} \u00b7 ${what}`;
    else if (emphasis.length) cap.textContent = `${kindLabel(f)} \u00b7 ${emphasis.length} row${emphasis.length === 1 ? '' : 's'} in colour`;
    else cap.textContent = `${what} of ${n > 64 ? `${n.toLocaleString('en-US')} rows (median and range)` : `every ${noun}`} \u00b7 hover the heatmap to follow one`;
  }

  function renderRowbar() {
    const rb = ui.rowbar;
    rb.collapseAll.hidden = rb.expandAll.hidden = st.groups.length === 0;
    rb.expandAll.disabled = st.rows.collapsed.size === 0;
    const z = st.rows.zoom;
    rb.zoomNote.hidden = rb.resetZoom.hidden = !z;
    if (z) {
      const steps = z.steps ? stepRangeText(z.steps) : 'every step';
      rb.zoomNote.textContent = `Zoomed: rows ${(z.rows[0] + 1).toLocaleString('en-US')}\u2013${(z.rows[1] + 1).toLocaleString('en-US')}, ${steps}`;
    }
  }

  function applyMarks() {
    const list = st.findings.run === (st.sel && st.sel.run) && compareMode() !== 'ratio' ? st.findings.list || [] : [];
    const byDisplay = new Map();
    for (const m of rowMarks(list, st.names)) {
      const d = main.heat._display(m.row);
      if (d < 0) continue;
      const prev = byDisplay.get(d);
      if (!prev || m.severity === 'error') byDisplay.set(d, {...m, row: d});
    }
    const rh = st.allZero ? 0 : st.layout.rowHeight;
    renderRowMarks(main.plot.marks, [...byDisplay.values()], rh, planRows(st.plan));
    renderRowMarks(other.plot.marks, [], rh, planRows(st.plan));
  }

  function highlightActive() {
    const f = activeFinding();
    other.heat.highlightCells(null);
    if (!f || !main.grid || st.findings.run !== st.sel.run || compareMode() === 'ratio') {
      main.heat.highlightCells(null);
    } else {
      const cells = findingCells(f, st.names);
      main.heat.highlightCells(cells.rows, cells.ranges);
    }
    updateChart(null);
  }

  /** The note under the controls that says which alignment a comparison uses, and the pressed button. */
  function renderAlignNote(mode) {
    if (mode && st.alignment) setSegmented(ui.align, st.alignment.mode);
    const lines = [];
    if (mode && st.alignment) {
      const [onlyA, onlyB] = st.onlyIn || [[], []];
      const total = st.names.length;
      lines.push(alignmentText(st.alignment, st.sel.run, st.compare.other, total - onlyA.length - onlyB.length, total));
      if (onlyA.length) lines.push(`Only in ${st.sel.run}: ${onlyA.slice(0, 20).join(', ')}${onlyA.length > 20 ? ', \u2026' : ''}`);
      if (onlyB.length) lines.push(`Only in ${st.compare.other}: ${onlyB.slice(0, 20).join(', ')}${onlyB.length > 20 ? ', \u2026' : ''}`);
    }
    ui.alignNote.hidden = lines.length === 0;
    ui.alignNote.replaceChildren(...lines.map((t) => Object.assign(doc.createElement('div'), {textContent: t})));
  }

  return {draw, updateChart, applyMarks, highlightActive, renderAlignNote};
}
