// The heatmap wire format, decoded once (pure; tested under node).
//
// The server (tb_gradcheck/reader/wire.py) sends values[step][row]; the tab draws
// rows top to bottom and steps left to right, so a decoded grid is stored
// row-major by row: index = row * cols + col. A grid is
//   {rows, cols, values: Float64Array, missing: Uint8Array,
//    status: Int8Array|null, statusNames: string[]|null,
//    rowStart: number, names: string[]}
// values holds the number (NaN and +-Infinity as themselves); missing[i] = 1
// marks "no gradient" (JSON null) and values[i] is then 0. status[i] is an
// index into statusNames (the server's order, ordered by severity, sent in
// the response rather than assumed here), -1 where the row was not checked.

const STRING_VALUES = {NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity};

/**
 * One JSON cell value of the heatmap route.
 * @param {*} x A number, null (no gradient), or "NaN", "Infinity", "-Infinity".
 * @returns {number|null} Any other string is NaN: it is not a number, and red
 *   is the colour that makes a reader look.
 */
export function parseValue(x) {
  if (typeof x === 'number') return x;
  if (x === null || x === undefined) return null;
  if (typeof x === 'string' && Object.prototype.hasOwnProperty.call(STRING_VALUES, x)) return STRING_VALUES[x];
  return NaN;
}

/**
 * Bytes of a base64 string. The browser's own decoder where it has one
 * (Uint8Array.fromBase64, Chromium 140 and later): a character loop over
 * atob's string took 0.12 s of the first draw for 2,000 rows x 1,000 steps.
 */
export function base64Bytes(text) {
  if (typeof Uint8Array.fromBase64 === 'function') return Uint8Array.fromBase64(text || '');
  const binary = atob(text || '');
  const out = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
  return out;
}

function float32s(text, count, what) {
  const bytes = base64Bytes(text);
  if (bytes.length !== count * 4) {
    throw new Error(`Expected ${count} float32 ${what}. Received: ${bytes.length} bytes`);
  }
  // Copy into an aligned buffer once; a Float32Array view reads little-endian
  // on every platform a browser runs on (x86, ARM), which DataView would check per value.
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

/**
 * Decodes a `heatmap` or `compare` response into a grid (see the top of this file).
 * @param {object} resp The JSON (encoding "f32" or "json").
 * @returns {object} The grid.
 * @throws {Error} The matrix does not have one value per step and row.
 */
export function decodeHeatmap(resp) {
  const rows = resp.layers.length;
  const cols = resp.steps.length;
  const n = rows * cols;
  const values = new Float64Array(n);
  const missing = new Uint8Array(n);
  if (resp.encoding === 'f32') {
    const src = float32s(resp.values_f32, n, `values (${cols} steps x ${rows} rows)`);
    const bits = base64Bytes(resp.missing_bits);
    for (let c = 0, k = 0; c < cols; c++) {
      for (let r = 0; r < rows; r++, k++) {
        const i = r * cols + c;
        if ((bits[k >> 3] >> (7 - (k & 7))) & 1) missing[i] = 1;
        else values[i] = src[k];
      }
    }
  } else {
    if (!Array.isArray(resp.values) || resp.values.length !== cols) {
      throw new Error(`Expected one row of values per step. Received: ${cols} steps, ` +
        `${Array.isArray(resp.values) ? resp.values.length : typeof resp.values} rows of values`);
    }
    for (let c = 0; c < cols; c++) {
      const line = resp.values[c];
      if (!Array.isArray(line) || line.length !== rows) {
        throw new Error(`Expected ${rows} values (one per row) at step ${resp.steps[c]}. ` +
          `Received: ${Array.isArray(line) ? line.length : typeof line}`);
      }
      for (let r = 0; r < rows; r++) {
        const v = parseValue(line[r]);
        if (v === null) missing[r * cols + c] = 1;
        else values[r * cols + c] = v;
      }
    }
  }
  return {
    rows, cols, values, missing, ...decodeStatus(resp, rows, cols),
    rowStart: resp.row_start || 0,
    names: resp.layers,
  };
}

/**
 * The check status of a response: codes into the response's own status_names.
 * @returns {{status: Int8Array|null, statusNames: string[]|null}}
 */
export function decodeStatus(resp, rows, cols) {
  const names = Array.isArray(resp.status_names) ? resp.status_names : null;
  if (!names || (resp.status_f32 == null && resp.status == null)) return {status: null, statusNames: null};
  const status = new Int8Array(rows * cols).fill(-1);
  if (resp.status_f32 != null) {
    const src = float32s(resp.status_f32, rows * cols, 'status codes');
    for (let c = 0, k = 0; c < cols; c++) {
      for (let r = 0; r < rows; r++, k++) {
        const code = src[k];
        if (code >= 0 && code < names.length) status[r * cols + c] = code;
      }
    }
  } else {
    for (let c = 0; c < cols; c++) {
      const line = resp.status[c] || [];
      for (let r = 0; r < rows; r++) status[r * cols + c] = names.indexOf(line[r] ?? null);
    }
  }
  return {status, statusNames: names};
}

/**
 * A grid re-indexed onto other rows, without decoding again: row i of the
 * result is row pick[i] of grid, or an absent row (missing everywhere) where
 * pick[i] < 0.
 * @param {object} grid From decodeHeatmap.
 * @param {Int32Array|number[]} pick
 * @param {string[]} names Names of the result's rows.
 * @returns {object} A grid with `absent` (Uint8Array, 1 = the run lacks the row).
 */
export function pickRows(grid, pick, names) {
  const {cols} = grid;
  const rows = pick.length;
  const values = new Float64Array(rows * cols);
  const missing = new Uint8Array(rows * cols).fill(1);
  const status = grid.status ? new Int8Array(rows * cols).fill(-1) : null;
  const absent = new Uint8Array(rows);
  for (let r = 0; r < rows; r++) {
    const j = pick[r];
    if (j < 0) {
      absent[r] = 1;
      continue;
    }
    values.set(grid.values.subarray(j * cols, (j + 1) * cols), r * cols);
    missing.set(grid.missing.subarray(j * cols, (j + 1) * cols), r * cols);
    if (status) status.set(grid.status.subarray(j * cols, (j + 1) * cols), r * cols);
  }
  return {...grid, rows, values, missing, status, absent, names, rowStart: 0};
}
