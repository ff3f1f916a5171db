// Comparing two runs (pure; tested under node): which rows of one run are
// which rows of the other.
//
// Keras names a model's variables under the model's own name, which changes
// with nothing but build order (`sequential` vs `sequential_1`) or what an
// experiment called it (`he_init/...` vs `wrong_gradient/...`). Two runs of
// one architecture then share no row name, but every row matches once the
// root scope is dropped: that is "by structure". By name stays available.
// The server's compare route applies the same rule (tb_gradcheck/wire.py
// structure_key) when asked with align=structure.

/** A row name without its root scope: "sequential_1/dense/kernel" -> "dense/kernel". */
export function structureKey(name) {
  const k = name.indexOf('/');
  return k >= 0 && k < name.length - 1 ? name.slice(k + 1) : name;
}

/** The root scope of a name ("sequential_1"), or "" when it has none. */
export function rootScope(name) {
  const k = name.indexOf('/');
  return k >= 0 ? name.slice(0, k) : '';
}

function keyFor(mode) {
  return mode === 'structure' ? structureKey : (n) => n;
}

/** How many rows of a find a row of b under an alignment (each row of b used once). */
export function matchedRows(a, b, mode) {
  const key = keyFor(mode);
  const keys = new Set(b.map(key));
  let n = 0;
  for (const r of a) {
    const k = key(r);
    if (keys.delete(k)) n++;
  }
  return n;
}

/**
 * The alignment to use when the user has not chosen: by structure when it
 * matches more rows than by name (differently named models of one
 * architecture), else by name.
 * @returns {{mode: 'name'|'structure', matched: number, roots: [string, string]}}
 */
export function chooseAlignment(a, b) {
  const byName = matchedRows(a, b, 'name');
  const byStructure = matchedRows(a, b, 'structure');
  const mode = byStructure > byName ? 'structure' : 'name';
  return {mode, matched: mode === 'structure' ? byStructure : byName, roots: [commonRoot(a), commonRoot(b)]};
}

function commonRoot(rows) {
  const roots = new Set(rows.map(rootScope));
  return roots.size === 1 ? [...roots][0] : '';
}

/**
 * Rows of a side-by-side view: a's rows in order, then rows only b has.
 * @param {string[]} a Rows of the run.
 * @param {string[]} b Rows of the compared run.
 * @param {'name'|'structure'} mode
 * @returns {{names: string[], pickA: Int32Array, pickB: Int32Array,
 *   onlyA: string[], onlyB: string[]}} names[i] is a's name of row i (b's
 *   when only b has it); pickA[i] / pickB[i] index the row in a / b, -1 when
 *   that run lacks it.
 */
export function alignRows(a, b, mode) {
  const key = keyFor(mode);
  const inB = new Map();
  b.forEach((r, j) => {
    const k = key(r);
    if (!inB.has(k)) inB.set(k, j);
  });
  const names = [];
  const pickA = [];
  const pickB = [];
  const used = new Set();
  a.forEach((r, i) => {
    const j = inB.get(key(r));
    const take = j !== undefined && !used.has(j);
    if (take) used.add(j);
    names.push(r);
    pickA.push(i);
    pickB.push(take ? j : -1);
  });
  b.forEach((r, j) => {
    if (used.has(j)) return;
    names.push(r);
    pickA.push(-1);
    pickB.push(j);
  });
  return {
    names, pickA: Int32Array.from(pickA), pickB: Int32Array.from(pickB),
    onlyA: names.filter((_, i) => pickB[i] < 0), onlyB: names.filter((_, i) => pickA[i] < 0),
  };
}

/** The sentence saying which alignment a comparison uses. */
export function alignmentText(alignment, runA, runB, matched, total) {
  const [ra, rb] = alignment.roots || ['', ''];
  const how = alignment.mode === 'structure'
    ? `rows aligned by structure${ra && rb && ra !== rb ? ` (${ra}/\u2026 \u2194 ${rb}/\u2026)` : ''}`
    : 'rows aligned by name';
  return `${how}: ${matched.toLocaleString('en-US')} of ${total.toLocaleString('en-US')} rows in both ${runA} and ${runB}`;
}
