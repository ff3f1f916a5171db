// Unit tests of frontend/wire.js (node --test): the one decoder of the
// heatmap wire format, checked against bytes packed as tb_gradcheck/reader/wire.py packs them.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {decodeHeatmap, parseValue, pickRows} from '../../frontend/wire.js';

// Little-endian float32, step-major (one float per row at each step), as numpy's '<f4'.
function f32(values) {
  return Buffer.from(new Float32Array(values).buffer).toString('base64');
}

// numpy.packbits order: most significant bit first.
function bits(flags) {
  const out = new Uint8Array(Math.ceil(flags.length / 8));
  flags.forEach((f, k) => {
    if (f) out[k >> 3] |= 1 << (7 - (k & 7));
  });
  return Buffer.from(out).toString('base64');
}

test('parse_value_reads_numbers_null_and_nonfinite_strings', () => {
  assert.equal(parseValue(1.5), 1.5);
  assert.equal(parseValue(0), 0);
  assert.equal(parseValue(null), null);
  assert.ok(Number.isNaN(parseValue('NaN')));
  assert.equal(parseValue('Infinity'), Infinity);
  assert.equal(parseValue('-Infinity'), -Infinity);
  assert.ok(Number.isNaN(parseValue('garbage')));
});

test('decode_f32_transposes_steps_by_rows_into_rows_by_steps', () => {
  // values[step][row] = [[1, 2], [NaN, missing], [Infinity, 4]]
  const g = decodeHeatmap({
    layers: ['a', 'b'], steps: [0, 1, 2], encoding: 'f32',
    values_f32: f32([1, 2, NaN, 0, Infinity, 4]), missing_bits: bits([0, 0, 0, 1, 0, 0]),
  });
  assert.equal(g.rows, 2);
  assert.equal(g.cols, 3);
  assert.deepEqual(Array.from(g.values.slice(0, 3)).map(String), ['1', 'NaN', 'Infinity']);
  assert.deepEqual(Array.from(g.missing), [0, 0, 0, 0, 1, 0]);
  assert.equal(g.values[5], 4);
  assert.equal(g.status, null);
  assert.deepEqual(g.names, ['a', 'b']);
});

test('decode_json_and_f32_give_the_same_grid', () => {
  const json = decodeHeatmap({layers: ['a', 'b'], steps: [3, 4], encoding: 'json', values: [[0.5, null], ['-Infinity', 1e-30]]});
  const packed = decodeHeatmap({layers: ['a', 'b'], steps: [3, 4], encoding: 'f32',
    values_f32: f32([0.5, 0, -Infinity, 1e-30]), missing_bits: bits([0, 1, 0, 0])});
  assert.deepEqual(Array.from(packed.missing), Array.from(json.missing));
  packed.values.forEach((v, i) => assert.equal(v, Math.fround(json.values[i])));
});

test('status_codes_follow_the_order_the_response_sends', () => {
  // The server's order (ok, inconclusive, mismatch) arrives with the
  // response; a client that assumed another order would read 2 as something else.
  const names = ['ok', 'inconclusive', 'mismatch'];
  const g = decodeHeatmap({layers: ['a', 'b'], steps: [0, 10], encoding: 'f32',
    values_f32: f32([1e-4, 0.03, 1e-4, 0.2]), missing_bits: bits([0, 0, 0, 0]),
    status_names: names, status_f32: f32([0, 2, NaN, 1])});
  assert.deepEqual(g.statusNames, names);
  // rows by steps: a = [ok, not checked], b = [mismatch, inconclusive]
  assert.deepEqual(Array.from(g.status), [0, -1, 2, 1]);
  const reordered = decodeHeatmap({layers: ['a'], steps: [0], encoding: 'json', values: [[1]],
    status_names: ['mismatch', 'ok'], status: [['ok']]});
  assert.equal(reordered.statusNames[reordered.status[0]], 'ok');
});

test('decode_rejects_a_matrix_of_the_wrong_size', () => {
  assert.throws(() => decodeHeatmap({layers: ['a', 'b'], steps: [0], encoding: 'f32', values_f32: f32([1]), missing_bits: ''}),
    /Expected 2 float32 values/);
  assert.throws(() => decodeHeatmap({layers: ['a'], steps: [0, 1], encoding: 'json', values: [[1]]}), /one row of values per step/);
  assert.throws(() => decodeHeatmap({layers: ['a', 'b'], steps: [0], encoding: 'json', values: [[1]]}), /Expected 2 values/);
});

test('pick_rows_reindexes_without_decoding_again_and_marks_absent_rows', () => {
  const g = decodeHeatmap({layers: ['a', 'b'], steps: [0, 1], encoding: 'json', values: [[1, 2], [3, 4]],
    status_names: ['ok', 'inconclusive', 'mismatch'], status: [['ok', 'mismatch'], [null, 'ok']]});
  const p = pickRows(g, [1, -1, 0], ['b', 'c', 'a']);
  assert.equal(p.rows, 3);
  assert.deepEqual(Array.from(p.values), [2, 4, 0, 0, 1, 3]);
  assert.deepEqual(Array.from(p.missing), [0, 0, 1, 1, 0, 0]);
  assert.deepEqual(Array.from(p.absent), [0, 1, 0]);
  assert.deepEqual(Array.from(p.status), [2, 0, -1, -1, 0, -1]);
});
