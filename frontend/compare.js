// Comparing two runs (pure; tested under node): which rows of one run are
// which rows of the other.
//
// The server decides (tb_gradcheck/reader/align.py, through `GET align` for the
// side-by-side view and the `compare` answer for the ratio), so the tab and
// the ratio always pair the same rows. By structure, rows pair by what they
// are: their order in depth and their variables' shapes, names breaking
// ties. Keras numbers every layer of a process (`sequential/dense` and
// `sequential_1/dense_4`) and experiments name models after themselves
// (`he_init/...` vs `wrong_gradient/...`): then only structure pairs them.
// By name stays available. This module lays the two runs' rows out on the
// answer and words the note that says which alignment the tab used.

/** The root scope of a name ("sequential_1"), or "" when it has none. */
export function rootScope(name) {
  const k = name.indexOf('/');
  return k >= 0 ? name.slice(0, k) : '';
}

function commonRoot(rows) {
  const roots = new Set(rows.filter((r) => r !== null).map(rootScope));
  return roots.size === 1 ? [...roots][0] : '';
}

/**
 * The alignment the tab shows, from an align or compare answer.
 * @param {object} resp With alignment, basis, matched, run_layers,
 *   other_layers, only_in_run, only_in_other (docs/http_api.md).
 * @returns {{mode: 'name'|'structure', basis: string, matched: number,
 *   total: number, roots: [string, string]}}
 */
export function alignmentOf(resp) {
  const onlyA = resp.only_in_run || [];
  const onlyB = resp.only_in_other || [];
  return {
    mode: resp.alignment, basis: resp.basis, matched: resp.matched,
    total: resp.matched + onlyA.length + onlyB.length,
    roots: [commonRoot(resp.run_layers || []), commonRoot(resp.other_layers || [])],
  };
}

/**
 * Rows of a side-by-side view: the aligned rows of an align answer, picked
 * out of the two heatmaps' rows by name. A heatmap row the answer does not
 * name (rows that arrived between the two requests) is kept, as a row only
 * its run has.
 * @param {{run_layers: (string|null)[], other_layers: (string|null)[]}} resp
 * @param {string[]} a Rows of the run's heatmap.
 * @param {string[]} b Rows of the compared run's heatmap.
 * @returns {{names: string[], pickA: Int32Array, pickB: Int32Array,
 *   onlyA: string[], onlyB: string[]}} names[i] is a's name of row i (b's
 *   when only b has it); pickA[i] / pickB[i] index the row in a / b, -1 when
 *   that run lacks it.
 */
export function alignRows(resp, a, b) {
  const inA = new Map(a.map((r, i) => [r, i]));
  const inB = new Map(b.map((r, j) => [r, j]));
  const names = [];
  const pickA = [];
  const pickB = [];
  const push = (i, j) => {
    names.push(i >= 0 ? a[i] : b[j]);
    pickA.push(i);
    pickB.push(j);
    if (i >= 0) inA.delete(a[i]);
    if (j >= 0) inB.delete(b[j]);
  };
  const ra = resp.run_layers || [];
  const rb = resp.other_layers || [];
  for (let k = 0; k < ra.length; k++) {
    const i = ra[k] !== null && inA.has(ra[k]) ? inA.get(ra[k]) : -1;
    const j = rb[k] !== null && inB.has(rb[k]) ? inB.get(rb[k]) : -1;
    if (i >= 0 || j >= 0) push(i, j);
  }
  for (const i of [...inA.values()]) push(i, -1);
  for (const j of [...inB.values()]) push(-1, j);
  return {
    names, pickA: Int32Array.from(pickA), pickB: Int32Array.from(pickB),
    onlyA: names.filter((_, i) => pickB[i] < 0), onlyB: names.filter((_, i) => pickA[i] < 0),
  };
}

/**
 * The second run's own labels for a side-by-side plan built on the aligned
 * rows (which carry the first run's names where it has the row): each
 * aligned row under the second run's name, a row only the first run has
 * under that name (drawn as absent), and each group under the second run's
 * prefix at the same depth when its rows share one.
 * @param {object} plan rows.buildPlan over the aligned names.
 * @param {{key: string, start: number, end: number}[]} groups rows.groupRows of them.
 * @param {string[]} names The aligned names (alignRows().names).
 * @param {(string|null)[]} own The second run's name of each aligned row, null where it lacks the row.
 * @param {Set<string>} [collapsed] Keys of the groups the plan collapses (as buildPlan's).
 * @param {object} [display] The second run's name -> label where a name is an index
 *   (its heatmap answer's `labels`: "0" -> "0 (Linear)"), as the first run's rows show theirs.
 * @returns {{names: string[], labels: string[], groupKeys: string[]}} names[i]
 *   for source row i, labels[d] for display row d (as plan.labels), groupKeys[g]
 *   for group g.
 */
export function ownLabels(plan, groups, names, own, collapsed = new Set(), display = {}) {
  const mine = names.map((n, i) => (own[i] == null ? n : own[i]));
  const groupKeys = groups.map((g) => {
    const depth = g.key.split('/').length - 1;
    const keys = new Set();
    for (let i = g.start; i < g.end; i++) {
      const parts = own[i] == null ? null : own[i].split('/');
      if (parts && parts.length > depth) keys.add(`${parts.slice(0, depth).join('/')}/`);
    }
    return keys.size === 1 ? [...keys][0] : g.key;
  });
  const labels = plan.labels.map((label, d) => {
    const g = plan.group[d];
    if (g >= 0 && collapsed.has(groups[g].key)) return `${groupKeys[g]} (${plan.starts[d + 1] - plan.starts[d]})`;
    const name = mine[plan.order[plan.starts[d]]];
    return display[name] || name;
  });
  return {names: mine, labels, groupKeys};
}

const BASIS_TEXT = {
  shapes: 'depth and shapes',
  sizes: 'depth and sizes (this log stores no shapes)',
  names: 'depth and names',
};

/** The sentence saying which alignment a comparison uses. */
export function alignmentText(alignment, runA, runB, matched, total) {
  const [ra, rb] = alignment.roots || ['', ''];
  const roots = ra && rb && ra !== rb ? `; ${ra}/\u2026 \u2194 ${rb}/\u2026` : '';
  const how = alignment.mode === 'structure'
    ? `rows aligned by structure (${BASIS_TEXT[alignment.basis] || 'depth'}${roots})`
    : 'rows aligned by name';
  return `${how}: ${matched.toLocaleString('en-US')} of ${total.toLocaleString('en-US')} rows in both ${runA} and ${runB}`;
}
