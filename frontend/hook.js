// The read-only hook browser tests and benchmarks use (window.tbGradcheck):
// what the tab shows, in plain data, plus poll() to refresh now.

/**
 * @param {object} env {st, main, other, compareMode(), activeFinding(), dark(), cellAt(p, x, y), poll()}
 */
export function debugHook(env) {
  const {st, main, other, compareMode, activeFinding, dark, cellAt, poll} = env;
  return Object.freeze({
  state() {
    const sel = st.sel || {};
    const resp = main.resp;
    const f = activeFinding();
    const binned = main.heat.binned;
    return {
      run: sel.run ?? null, metric: sel.metric ?? null, granularity: sel.granularity ?? null,
      aggregate: sel.aggregate ?? null, scale: compareMode() === 'ratio' ? 'ratio' : st.scale,
      rows: st.names.slice(), displayRows: st.plan ? st.plan.labels.slice() : [],
      pixelRows: binned ? binned.rows : 0, groups: st.groups.map((g) => g.key),
      steps: resp ? (resp.num_steps ?? resp.steps.length) : 0, columns: resp ? resp.steps.length : 0,
      firstStep: main.axis ? main.axis.first : null, lastStep: main.axis ? main.axis.end - 1 : null,
      drawn: st.drawn, allZero: st.allZero, dark: dark(), zoom: st.rows.zoom,
      compare: {other: compareMode() ? st.compare.other : null, mode: compareMode(), alignment: compareMode() && st.alignment ? st.alignment.mode : null},
      otherRows: other.grid && compareMode() === 'side' ? st.names.slice() : [],
      // What the lower plot labels its display rows with: the compared run's own names.
      otherLabels: other.grid && compareMode() === 'side' && other.labels ? other.labels.slice() : [],
      findings: st.findings.list ? st.findings.list.map((x) => ({kind: x.kind, severity: x.severity, layers: x.layers.slice()})) : null,
      findingsRun: st.findings.run, activeFinding: f ? f.kind : null,
      highlight: main.heat.highlightedCells().map(([d, c0, c1]) => [
        st.plan.labels[d], resp.steps[c0], resp.step_ends ? resp.step_ends[c1] : resp.steps[c1],
      ]),
      loads: st.loads, polls: st.polls,
    };
  },
  lastDrawMs: () => main.heat.lastDrawMs,
  /** The last full repaint (heatmaps, labels, chart, legend), ms. */
  lastPaintMs: () => st.lastPaintMs,
  /** {requested, parsed, drawn}: performance.now() times of the last matrix load. */
  timing: () => st.timing,
  cellAt(clientX, clientY) {
    for (const p of [main, other]) {
      const c = cellAt(p, clientX, clientY);
      if (c) return {run: c.run, row: c.row, rowName: c.rowName, step: c.step, stepEnd: c.stepEnd, value: c.value, status: c.status};
    }
    return null;
  },
  poll: () => poll(),
});
}
