// The read-only hook browser tests and benchmarks use (window.tbGradcheck):
// what the tab shows, in plain data, plus poll() to refresh now.

import {cellAt} from './pointer.js';
import {activeFinding, compareMode, currentScale} from './state.js';

/** What the tab shows, in plain data (the hook's state()). */
function shownState(view, st, dark) {
  const sel = st.sel || {};
  const resp = st.main.resp;
  const axis = st.main.axis;
  const mode = compareMode(st);
  const side = !!st.other.grid && mode === 'side';
  const f = activeFinding(st);
  const heat = view.panes.main.heat;
  const binned = heat.binned;
  return {
    run: sel.run ?? null, metric: sel.metric ?? null, granularity: sel.granularity ?? null,
    aggregate: sel.aggregate ?? null, scale: mode === 'ratio' ? 'ratio' : currentScale(st),
    rows: st.names.slice(), displayRows: st.plan ? st.plan.labels.slice() : [],
    pixelRows: binned ? binned.rows : 0, groups: st.groups.map((g) => g.key),
    steps: resp ? (resp.num_steps ?? resp.steps.length) : 0, columns: resp ? resp.steps.length : 0,
    firstStep: axis ? axis.first : null, lastStep: axis ? axis.end - 1 : null,
    drawn: st.painted.drawn, allZero: st.painted.allZero, dark: dark(), zoom: st.rows.zoom,
    compare: {other: mode ? st.compare.other : null, mode, alignment: mode && st.alignment ? st.alignment.mode : null},
    otherRows: side ? st.names.slice() : [],
    // What the lower plot labels its display rows with: the compared run's own names.
    otherLabels: side && st.painted.otherLabels ? st.painted.otherLabels.slice() : [],
    findings: st.findings.list ? st.findings.list.map((x) => ({kind: x.kind, severity: x.severity, layers: x.layers.slice()})) : null,
    findingsRun: st.findings.run, activeFinding: f ? f.kind : null,
    highlight: heat.highlightedCells().map(([d, c0, c1]) => [
      st.plan.labels[d], resp.steps[c0], resp.step_ends ? resp.step_ends[c1] : resp.steps[c1],
    ]),
    loads: st.loads, polls: st.polls,
  };
}

/**
 * @param {object} view paint's View.
 * @param {object} st The tab's state (read only).
 * @param {{dark: () => boolean, poll: () => Promise}} env dark: whether the tab is dark; poll: refresh now.
 */
export function debugHook(view, st, {dark, poll}) {
  return Object.freeze({
    state: () => shownState(view, st, dark),
    lastDrawMs: () => view.panes.main.heat.lastDrawMs,
    /** The last full repaint (heatmaps, labels, chart, legend), ms. */
    lastPaintMs: () => st.painted.ms,
    /** {requested, parsed, drawn}: performance.now() times of the last matrix load. */
    timing: () => st.timing,
    cellAt(clientX, clientY) {
      for (const key of ['main', 'other']) {
        const c = cellAt(view, st, key, clientX, clientY);
        if (c) return {run: c.run, row: c.row, rowName: c.rowName, step: c.step, stepEnd: c.stepEnd, value: c.value, status: c.status};
      }
      return null;
    },
    poll: () => poll(),
  });
}
