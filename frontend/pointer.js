// The pointer over the heatmaps (DOM): the tooltip and hover, at most one
// update per animation frame, and dragging a box to zoom into rows and steps.

import {sourceRows} from './rows.js';
import {cellRows, tooltipRows} from './tooltip.js';
import {hideTooltip, setActiveRow, showTooltip} from './views.js';

/**
 * @param {object} env {ui, st, main, other, compareMode(), updateChart(bin), zoomTo(zoom)}
 * @returns {{cellAt: (p, clientX, clientY) => object|null}}
 */
export function wirePointer(env) {
  const {ui, st, main, other, compareMode, updateChart, zoomTo} = env;
  // Drag on a heatmap: a box of rows and steps to zoom into.
  let drag = null;
  for (const p of [main, other]) {
    const ov = p.heat.overlay;
    ov.addEventListener('mousedown', (e) => {
      const r = ov.getBoundingClientRect();
      drag = {p, r, x0: e.clientX - r.left, y0: e.clientY - r.top};
      e.preventDefault();
    });
  }
  window.addEventListener('mousemove', (e) => {
    if (!drag) return;
    drag.x1 = Math.max(0, Math.min(drag.r.width - 1, e.clientX - drag.r.left));
    drag.y1 = Math.max(0, Math.min(drag.r.height - 1, e.clientY - drag.r.top));
    drag.p.heat.setSelection({x0: drag.x0, y0: drag.y0, x1: drag.x1, y1: drag.y1});
  });
  window.addEventListener('mouseup', () => {
    const d = drag;
    drag = null;
    if (!d) return;
    d.p.heat.setSelection(null);
    if (d.x1 === undefined || (Math.abs(d.x1 - d.x0) < 5 && Math.abs(d.y1 - d.y0) < 5)) return;
    const a = d.p.heat.binAt(Math.min(d.x0, d.x1), Math.min(d.y0, d.y1));
    const b = d.p.heat.binAt(Math.max(d.x0, d.x1), Math.max(d.y0, d.y1));
    if (!a || !b) return;
    const src = sourceRows(st.plan, a.d0, b.d1);
    const resp = d.p.resp;
    const ends = resp.step_ends || resp.steps;
    zoomTo({rows: [src[0], src[src.length - 1]], steps: [resp.steps[a.col0], ends[b.col1]]});
  });


  function cellAt(p, clientX, clientY) {
    if (!p.grid || !p.heat.binned || p.heat.canvas.hidden || p.plot.root.hidden) return null;
    const rect = p.heat.canvas.getBoundingClientRect();
    const bin = p.heat.binAt(clientX - rect.left, clientY - rect.top);
    if (!bin) return null;
    const ratio = p === main && compareMode() === 'ratio';
    return {
      ...cellRows(st.plan, st.names, bin, p.resp, p.grid),
      run: ratio ? `${st.sel.run} \u00f7 ${st.compare.other}` : p.run, paneRun: p.run, ratio, bin,
      otherName: (p === other || ratio) && other.names ? other.names[sourceRows(st.plan, bin.d0, bin.d0)[0]] : null,
      check: st.checks,
    };
  }

  let pending = null;
  for (const p of [main, other]) {
    p.heat.overlay.addEventListener('mousemove', (e) => {
      if (drag) return;
      const first = pending === null;
      pending = {p, x: e.clientX, y: e.clientY};
      if (!first) return;
      window.requestAnimationFrame(() => {
        const q = pending;
        pending = null;
        const c = cellAt(q.p, q.x, q.y);
        if (!c) return leave(q.p);
        for (const x of [main, other]) x.heat.setHover(x === q.p ? c.bin : null);
        for (const x of [main, other]) setActiveRow(x.plot.labels, c.bin.d0);
        updateChart(q.p === main ? c.bin : null);
        showTooltip(ui.tooltip, tooltipRows(c), q.x, q.y);
      });
    });
    p.heat.overlay.addEventListener('mouseleave', () => leave(p));
  }
  function leave(p) {
    pending = null;
    hideTooltip(ui.tooltip);
    p.heat.setHover(null);
    for (const x of [main, other]) setActiveRow(x.plot.labels, null);
    updateChart(null);
  }

  return {cellAt};
}
