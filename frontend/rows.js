// Rows of the Gradients tab (pure; tested under node): grouping rows by name
// prefix, the display plan (groups collapsed or expanded, a substring filter,
// a zoomed range), binning display rows into the visible height and binning
// a decoded grid into pixels keeping extremes, and row labels.
//
// A plan is the list of display rows, each a set of source rows:
//   {order: Int32Array, starts: Int32Array, labels: string[], group: Int32Array,
//    first: Uint8Array}
// display row d covers source rows order[starts[d]] .. order[starts[d+1] - 1]
// (indices into the run's full row list); group[d] is its group's index or
// -1, first[d] is 1 on the first display row of a group (or a lone row).

/**
 * The prefix ending in "/" that every name shares, or "" (labels drop it;
 * tooltips never do). Needs two names and leaves every name something.
 */
export function sharedPrefix(names) {
  if (names.length < 2) return '';
  let prefix = names[0];
  for (const name of names) {
    let i = 0;
    while (i < prefix.length && i < name.length && prefix[i] === name[i]) i++;
    prefix = prefix.slice(0, i);
    if (!prefix) return '';
  }
  const cut = prefix.lastIndexOf('/');
  if (cut < 0) return '';
  prefix = prefix.slice(0, cut + 1);
  return names.every((n) => n.length > prefix.length) ? prefix : '';
}

/**
 * Groups consecutive rows by name prefix: the repeated blocks of a model
 * (transformer/block_03/..., sequential/dense_1/kernel and .../bias).
 * Below the shared prefix, the grouping depth is, among the depths whose
 * groups of two or more rows cover at least 90% of the most any depth
 * covers, the one with the most groups (the shallowest on a tie): a
 * transformer groups by block (not by attn/ and mlp/ inside it, which leave
 * the layer norms out), and encoder/block_0/... and decoder/block_0/...
 * group by block, not by half.
 * @param {string[]} names Row names in depth order.
 * @returns {{key: string, label: string, start: number, end: number}[]}
 *   Groups of >= 2 consecutive rows, [start, end) source indices; key is the
 *   full prefix (ends in "/"), label the part after the shared prefix.
 */
export function groupRows(names) {
  const prefix = sharedPrefix(names);
  const parts = names.map((n) => n.slice(prefix.length).split('/'));
  const deepest = Math.max(0, ...parts.map((p) => p.length - 1));
  const found = [];
  for (let depth = 1; depth <= deepest; depth++) {
    const groups = [];
    let run = null;
    parts.forEach((p, i) => {
      const key = p.length > depth ? p.slice(0, depth).join('/') + '/' : null;
      if (key !== null && run && run.label === key) {
        run.end = i + 1;
        return;
      }
      run = key === null ? null : {key: prefix + key, label: key, start: i, end: i + 1};
      if (run) groups.push(run);
    });
    const multi = groups.filter((g) => g.end - g.start >= 2);
    found.push({multi, covered: multi.reduce((n, g) => n + g.end - g.start, 0)});
  }
  const most = Math.max(0, ...found.map((f) => f.covered));
  let best = [];
  for (const f of found) if (f.covered >= 0.9 * most && f.multi.length > best.length) best = f.multi;
  return best;
}

/**
 * The display rows.
 * @param {string[]} names Every row of the run.
 * @param {object[]} groups From groupRows.
 * @param {{collapsed?: Set<string>, filter?: string, range?: [number, number]|null}} opts
 *   collapsed: keys of groups shown as one row (the max of its rows);
 *   filter: keep rows whose name contains it (case-insensitive);
 *   range: keep source rows [first, last] only (zoom).
 * @returns {object} A plan (see the top of this file).
 */
export function buildPlan(names, groups, opts = {}) {
  const collapsed = opts.collapsed || new Set();
  const needle = (opts.filter || '').trim().toLowerCase();
  const [lo, hi] = opts.range || [0, names.length - 1];
  const groupAt = new Int32Array(names.length).fill(-1);
  groups.forEach((g, k) => groupAt.fill(k, g.start, g.end));
  // A row named by an index shows (and is found by) its label: "0 (Linear)".
  const display = opts.display || {};
  const shown = (i) => display[names[i]] || names[i];
  const keep = (i) => i >= lo && i <= hi && (!needle || shown(i).toLowerCase().includes(needle));
  const order = [];
  const starts = [];
  const labels = [];
  const group = [];
  const first = [];
  let i = 0;
  while (i < names.length) {
    const k = groupAt[i];
    if (k >= 0 && collapsed.has(groups[k].key)) {
      const g = groups[k];
      const members = [];
      for (let j = g.start; j < g.end; j++) if (keep(j)) members.push(j);
      if (members.length) {
        starts.push(order.length);
        order.push(...members);
        labels.push(`${g.key} (${members.length})`);
        group.push(k);
        first.push(1);
      }
      i = g.end;
      continue;
    }
    if (keep(i)) {
      starts.push(order.length);
      order.push(i);
      labels.push(shown(i));
      group.push(k);
      first.push(k < 0 || i === groups[k].start || !keep(i - 1) || group[group.length - 2] !== k ? 1 : 0);
    }
    i++;
  }
  starts.push(order.length);
  return {
    order: Int32Array.from(order), starts: Int32Array.from(starts), labels,
    group: Int32Array.from(group), first: Uint8Array.from(first),
  };
}

/** Number of display rows of a plan. */
export function planRows(plan) {
  return plan.starts.length - 1;
}

/** The source rows of display rows [d0, d1] (inclusive), ascending. */
export function sourceRows(plan, d0, d1) {
  return Array.from(plan.order.subarray(plan.starts[d0], plan.starts[d1 + 1])).sort((a, b) => a - b);
}

/**
 * Edges of m near-equal bins over n items: bin i is [edges[i], edges[i+1]).
 * @returns {Int32Array} m + 1 entries, edges[0] = 0, edges[m] = n.
 */
export function binEdges(n, m) {
  const edges = new Int32Array(m + 1);
  for (let i = 0; i <= m; i++) edges[i] = Math.floor((i * n) / m);
  return edges;
}

/**
 * Row height for display rows in the visible height: every row fits.
 * @param {number} rows Display rows.
 * @param {number} available CSS pixels the heatmap may use.
 * @param {number} [maxRow] Tallest row, default 24.
 * @returns {{rowHeight: number, height: number}} rowHeight may be below one
 *   pixel: rows then share pixels and are binned, keeping extremes.
 */
export function fitHeight(rows, available, maxRow = 24) {
  if (rows <= 0) return {rowHeight: 0, height: 0};
  const rowHeight = Math.min(maxRow, available / rows);
  const snapped = rowHeight >= 4 ? Math.floor(rowHeight) : rowHeight;
  return {rowHeight: snapped, height: Math.max(1, Math.round(snapped * rows))};
}

/**
 * Bins a decoded grid into pixels, keeping extremes: a bin is the max of its
 * finite values; any NaN in it makes it NaN, else any +Infinity makes it
 * +Infinity, else any -Infinity makes it -Infinity; a bin with nothing
 * present stays missing; status keeps the highest code (the server orders
 * statuses by severity).
 * @param {object} grid From wire.decodeHeatmap (rows from grid.rowStart on).
 * @param {object} plan From buildPlan.
 * @param {Int32Array} rowBins Edges over display rows (binEdges).
 * @param {{start: Int32Array, end: Int32Array}} pixels From axes.pixelColumns.
 * @returns {{rows, cols, values, missing, status, rowBins}} rows = bins, cols = pixels.
 */
export function binGrid(grid, plan, rowBins, pixels) {
  const outRows = rowBins.length - 1;
  const outCols = pixels.start.length;
  const n = outRows * outCols;
  const values = new Float64Array(n);
  const missing = new Uint8Array(n);
  // Per output column: 0 = empty, 1 = finite, 2 = -Inf, 3 = +Inf, 4 = NaN.
  const state = new Uint8Array(outCols);
  const best = new Float64Array(outCols);
  const {cols, rowStart, rows} = grid;
  const src = grid.values;
  const srcMissing = grid.missing;
  const pStart = pixels.start;
  const pEnd = pixels.end;
  const {order, starts} = plan;
  // The hot loop of a first draw (2,000 rows x 1,000 columns is 2 M cells):
  // locals only, and finiteness as v - v === 0 (NaN and +-Infinity give NaN),
  // so a finite value, by far the most common, takes one test.
  for (let br = 0; br < outRows; br++) {
    state.fill(0);
    best.fill(-Infinity);
    const last = starts[rowBins[br + 1]];
    for (let k = starts[rowBins[br]]; k < last; k++) {
      const r = order[k] - rowStart;
      if (r < 0 || r >= rows) continue;
      const base = r * cols;
      for (let x = 0; x < outCols; x++) {
        const e = base + pEnd[x];
        for (let i = base + pStart[x]; i <= e; i++) {
          if (srcMissing[i]) continue;
          const v = src[i];
          if (v - v === 0) {
            if (v > best[x]) best[x] = v;
            if (state[x] === 0) state[x] = 1;
          } else {
            const code = v !== v ? 4 : v > 0 ? 3 : 2;
            if (code > state[x]) state[x] = code;
          }
        }
      }
    }
    const out = br * outCols;
    for (let x = 0; x < outCols; x++) {
      const st = state[x];
      if (st === 0) missing[out + x] = 1;
      else values[out + x] = st === 1 ? best[x] : st === 4 ? NaN : st === 3 ? Infinity : -Infinity;
    }
  }
  const status = grid.status ? binStatus(grid, plan, rowBins, pixels) : null;
  return {rows: outRows, cols: outCols, values, missing, status, rowBins};
}

/** The highest status code per bin, -1 where none (check heatmaps only; see binGrid). */
function binStatus(grid, plan, rowBins, pixels) {
  const outRows = rowBins.length - 1;
  const outCols = pixels.start.length;
  const status = new Int8Array(outRows * outCols).fill(-1);
  const {cols, rowStart, rows} = grid;
  const src = grid.status;
  for (let br = 0; br < outRows; br++) {
    const out = br * outCols;
    for (let k = plan.starts[rowBins[br]]; k < plan.starts[rowBins[br + 1]]; k++) {
      const r = plan.order[k] - rowStart;
      if (r < 0 || r >= rows) continue;
      const base = r * cols;
      for (let x = 0; x < outCols; x++) {
        for (let i = base + pixels.start[x], e = base + pixels.end[x]; i <= e; i++) {
          if (src[i] > status[out + x]) status[out + x] = src[i];
        }
      }
    }
  }
  return status;
}

/**
 * Shortens a label to fit maxWidth by cutting its middle ("enc…/kernel"):
 * the end of a layer path tells layers apart, the start says where they are.
 */
export function fitLabel(text, maxWidth, measure) {
  if (measure(text) <= maxWidth) return text;
  const cut = (k) => {
    const head = Math.floor(k * 0.4);
    return text.slice(0, head) + '\u2026' + text.slice(text.length - (k - head));
  };
  let lo = 0;
  let hi = text.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (measure(cut(mid)) <= maxWidth) lo = mid;
    else hi = mid - 1;
  }
  return cut(lo);
}

/**
 * Which display rows get a label, at least `spacing` pixels apart: first
 * rows of groups before other rows, so 2,000 rows read as their blocks.
 * @returns {number[]} Display rows, ascending.
 */
export function labelledRows(plan, rowHeight, spacing = 14) {
  const n = planRows(plan);
  if (rowHeight >= spacing) return Array.from({length: n}, (_, d) => d);
  const out = [];
  let next = -Infinity;
  const pass = (want) => {
    for (let d = 0; d < n; d++) {
      // Where the label's centre lands: labels near the top (bottom) are
      // pushed down (up) to stay inside the column, so they count from there.
      const y = Math.min(Math.max(spacing / 2, (d + 0.5) * rowHeight), n * rowHeight - spacing / 2);
      if (want(d) && y >= next) {
        out.push(d);
        next = y + spacing;
      }
    }
  };
  pass((d) => plan.first[d] === 1);
  if (out.length < 2) {
    out.length = 0;
    next = -Infinity;
    pass(() => true);
  }
  return out;
}

/**
 * Merges highlighted cells of consecutive rows with the same columns into
 * blocks, so a finding over many layers is one outlined area.
 * @param {[number, number, number][]} cells [row, col0, col1], any order.
 * @returns {[number, number, number, number][]} [row0, row1, col0, col1].
 */
export function mergeCellRuns(cells) {
  const sorted = cells.slice().sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const out = [];
  for (const [r, c0, c1] of sorted) {
    const last = out[out.length - 1];
    if (last && last[1] + 1 === r && last[2] === c0 && last[3] === c1) last[1] = r;
    else if (last && last[1] === r && last[2] === c0 && last[3] === c1) continue;
    else out.push([r, r, c0, c1]);
  }
  return out;
}
