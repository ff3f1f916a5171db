// The pointer over the heatmaps (DOM): the tooltip and hover, at most one
// update per animation frame, and dragging a box to zoom into rows and steps.

import {sourceRows} from './rows.js';
import {compareMode} from './state.js';
import {cellRows, tooltipRows} from './tooltip.js';
import {hideTooltip, setActiveRow, showTooltip} from './views.js';

const PANES = ['main', 'other'];

/**
 * What is under a point of a plot: the cell's rows, steps and value, and
 * what the tooltip needs beside them.
 * @param {object} view paint's View.
 * @param {object} st The tab's state (read only).
 * @param {'main'|'other'} key The plot.
 * @returns {object|null} null where no drawn cell is.
 */
export function cellAt(view, st, key, clientX, clientY) {
  const {plot, heat} = view.panes[key];
  const pane = st[key];
  if (!pane.grid || !heat.binned || heat.canvas.hidden || plot.root.hidden) return null;
  const rect = heat.canvas.getBoundingClientRect();
  const bin = heat.binAt(clientX - rect.left, clientY - rect.top);
  if (!bin) return null;
  const ratio = key === 'main' && compareMode(st) === 'ratio';
  return {
    ...cellRows(st.plan, st.names, bin, pane.resp, pane.grid, st.display),
    run: ratio ? `${st.sel.run} \u00f7 ${st.compare.other}` : pane.run, paneRun: pane.run, ratio, bin,
    otherName: (key === 'other' || ratio) && st.otherNames ? st.otherNames[sourceRows(st.plan, bin.d0, bin.d0)[0]] : null,
    check: st.checks,
  };
}

// Drag on a heatmap: a box of rows and steps to zoom into.
function wireDrag(view, st, zoomTo) {
  let drag = null;
  for (const key of PANES) {
    const ov = view.panes[key].heat.overlay;
    ov.addEventListener('mousedown', (e) => {
      const r = ov.getBoundingClientRect();
      drag = {key, r, x0: e.clientX - r.left, y0: e.clientY - r.top};
      e.preventDefault();
    });
  }
  window.addEventListener('mousemove', (e) => {
    if (!drag) return;
    drag.x1 = Math.max(0, Math.min(drag.r.width - 1, e.clientX - drag.r.left));
    drag.y1 = Math.max(0, Math.min(drag.r.height - 1, e.clientY - drag.r.top));
    view.panes[drag.key].heat.setSelection({x0: drag.x0, y0: drag.y0, x1: drag.x1, y1: drag.y1});
  });
  window.addEventListener('mouseup', () => {
    const d = drag;
    drag = null;
    if (!d) return;
    const heat = view.panes[d.key].heat;
    heat.setSelection(null);
    if (d.x1 === undefined || (Math.abs(d.x1 - d.x0) < 5 && Math.abs(d.y1 - d.y0) < 5)) return;
    const a = heat.binAt(Math.min(d.x0, d.x1), Math.min(d.y0, d.y1));
    const b = heat.binAt(Math.max(d.x0, d.x1), Math.max(d.y0, d.y1));
    if (!a || !b) return;
    const src = sourceRows(st.plan, a.d0, b.d1);
    const resp = st[d.key].resp;
    const ends = resp.step_ends || resp.steps;
    zoomTo({rows: [src[0], src[src.length - 1]], steps: [resp.steps[a.col0], ends[b.col1]]});
  });
  return () => drag !== null;
}

/**
 * Wires hover (tooltip, row label, chart) and drag-to-zoom on both heatmaps.
 * @param {object} view paint's View.
 * @param {object} st The tab's state (read only).
 * @param {{hover(bin), zoomTo(zoom)}} on hover: the bin under the pointer
 *   on the main plot, or null; zoomTo: a box was dragged.
 */
export function wirePointer(view, st, on) {
  const dragging = wireDrag(view, st, on.zoomTo);
  const {ui} = view;
  let pending = null;
  const leave = (key) => {
    pending = null;
    hideTooltip(ui.tooltip);
    view.panes[key].heat.setHover(null);
    for (const k of PANES) setActiveRow(view.panes[k].plot.labels, null);
    on.hover(null);
  };
  for (const key of PANES) {
    const overlay = view.panes[key].heat.overlay;
    overlay.addEventListener('mousemove', (e) => {
      if (dragging()) return;
      const first = pending === null;
      pending = {key, x: e.clientX, y: e.clientY};
      if (!first) return;
      window.requestAnimationFrame(() => {
        const q = pending;
        pending = null;
        const c = cellAt(view, st, q.key, q.x, q.y);
        if (!c) return leave(q.key);
        for (const k of PANES) view.panes[k].heat.setHover(k === q.key ? c.bin : null);
        for (const k of PANES) setActiveRow(view.panes[k].plot.labels, c.bin.d0);
        on.hover(q.key === 'main' ? c.bin : null);
        showTooltip(ui.tooltip, tooltipRows(c), q.x, q.y);
      });
    });
    overlay.addEventListener('mouseleave', () => leave(key));
  }
}
