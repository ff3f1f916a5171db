// Unit tests of the pure helpers in frontend/heatmap.js (node --test).
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  LUT_SIZE, SPECIAL_COLORS, VIRIDIS_LUT, binEdges, buildViridisLut, colorize, columnOfStep, downsampleGrid,
  fitLabel, formatTicks, formatValue, linearTicks, logTicks, makeScale, parseHeatmap, parseValue, plotHeight,
  sharedPrefix, stepPosition, stepTicks, valueDomain,
  parseF32Heatmap,
} from '../../frontend/heatmap.js';

// Published viridis (matplotlib) entries as hex, at LUT indices 0, 64, 128,
// 192 and 255. The LUT rounds a cubic fit through knots of that table, so
// one unit per channel is the most it may be off.
const VIRIDIS_REFERENCE = [
  [0, '440154'], [64, '3b528b'], [128, '21918c'], [192, '5ec962'], [255, 'fde725'],
];
const LUT_TOLERANCE = 1;

function hexRgb(hex) {
  return [0, 2, 4].map((i) => parseInt(hex.slice(i, i + 2), 16));
}

function lutAt(i) {
  return Array.from(VIRIDIS_LUT.slice(i * 4, i * 4 + 3));
}

// CIE L* of an sRGB colour (D65), the lightness a perceptually uniform map
// must increase monotonically.
function lightness([r, g, b]) {
  const lin = (c) => {
    const s = c / 255;
    return s <= 0.04045 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  };
  const y = 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
  return y > 216 / 24389 ? 116 * Math.cbrt(y) - 16 : (24389 / 27) * y;
}

function grid(rows, cols, fill = 1) {
  return {rows, cols, values: new Float64Array(rows * cols).fill(fill), missing: new Uint8Array(rows * cols), status: null};
}

test('lut_has_256_opaque_entries', () => {
  assert.equal(LUT_SIZE, 256);
  assert.equal(VIRIDIS_LUT.length, 256 * 4);
  for (let i = 0; i < 256; i++) assert.equal(VIRIDIS_LUT[i * 4 + 3], 255);
});

test('lut_matches_published_viridis_at_endpoints_and_quartiles', () => {
  for (const [i, hex] of VIRIDIS_REFERENCE) {
    const got = lutAt(i);
    const want = hexRgb(hex);
    for (let c = 0; c < 3; c++) {
      assert.ok(Math.abs(got[c] - want[c]) <= LUT_TOLERANCE, `entry ${i}: got ${got}, want ${want} (#${hex})`);
    }
  }
});

// Rounding to 8 bits can take a neighbour's L* back by a few hundredths (the
// published 8-bit table itself does at entry 95: R drops by one, G and B stay),
// so each step may dip by at most this much, and every 4 entries must climb.
const LIGHTNESS_ROUNDING = 0.1;

test('lut_lightness_increases_monotonically', () => {
  const l = Array.from({length: 256}, (_, i) => lightness(lutAt(i)));
  for (let i = 1; i < 256; i++) {
    assert.ok(l[i] > l[i - 1] - LIGHTNESS_ROUNDING, `L* drops at entry ${i}: ${l[i]} after ${l[i - 1]}`);
  }
  for (let i = 4; i < 256; i++) assert.ok(l[i] > l[i - 4], `L* not increasing over entries ${i - 4}..${i}`);
  assert.ok(lightness(lutAt(0)) < 20 && lightness(lutAt(255)) > 85);
});

test('lut_is_built_deterministically', () => {
  assert.deepEqual(buildViridisLut(), VIRIDIS_LUT);
});

test('special_colours_are_far_from_every_lut_entry_and_each_other', () => {
  const dist = (a, b) => Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]);
  const specials = Object.values(SPECIAL_COLORS);
  for (const s of specials) {
    for (let i = 0; i < 256; i++) assert.ok(dist(s, lutAt(i)) > 40, `${s} close to LUT[${i}]`);
    for (const t of specials) if (s !== t) assert.ok(dist(s, t) > 100);
  }
});

test('parse_value_reads_numbers_null_and_nonfinite_strings', () => {
  assert.equal(parseValue(1.5), 1.5);
  assert.equal(parseValue(0), 0);
  assert.equal(parseValue(null), null);
  assert.ok(Number.isNaN(parseValue('NaN')));
  assert.equal(parseValue('Infinity'), Infinity);
  assert.equal(parseValue('-Infinity'), -Infinity);
  assert.ok(Number.isNaN(parseValue('garbage')));
});

test('parse_heatmap_transposes_steps_by_layers_into_rows_by_steps', () => {
  const g = parseHeatmap({
    layers: ['a', 'b'],
    steps: [0, 1, 2],
    values: [[1.2e-7, 0.0031], [1.1e-7, 'NaN'], [null, 0.0029]],
    status: null,
  });
  assert.equal(g.rows, 2);
  assert.equal(g.cols, 3);
  // Row 0 = layer a across steps, row 1 = layer b.
  assert.deepEqual(Array.from(g.values.slice(0, 2)), [1.2e-7, 1.1e-7]);
  assert.equal(g.missing[2], 1);
  assert.equal(g.values[3], 0.0031);
  assert.ok(Number.isNaN(g.values[4]));
  assert.equal(g.values[5], 0.0029);
  assert.deepEqual(Array.from(g.missing), [0, 0, 1, 0, 0, 0]);
  assert.equal(g.status, null);
});

test('parse_heatmap_reads_status_matrix', () => {
  const g = parseHeatmap({
    layers: ['a', 'b'], steps: [5],
    values: [[0.1, 0.2]], status: [['mismatch', null]],
  });
  assert.deepEqual(Array.from(g.status), [2, 0]);
});

test('parse_heatmap_rejects_wrong_shape', () => {
  assert.throws(() => parseHeatmap({layers: ['a'], steps: [0, 1], values: [[1]]}), /one row of values per step/);
  assert.throws(() => parseHeatmap({layers: ['a', 'b'], steps: [0], values: [[1]]}), /Expected 2 values/);
});

test('value_domain_log_ignores_zero_negative_nonfinite_and_missing', () => {
  const values = new Float64Array([0, -3, NaN, Infinity, 1e-6, 0.5, 1e3]);
  const missing = new Uint8Array([0, 0, 0, 0, 0, 0, 1]);
  assert.deepEqual(valueDomain(values, missing, 'log'), {min: 1e-6, max: 0.5});
  assert.deepEqual(valueDomain(values, missing, 'linear'), {min: -3, max: 0.5});
  assert.equal(valueDomain(new Float64Array([0, NaN]), null, 'log'), null);
});

test('log_scale_maps_decades_linearly', () => {
  const s = makeScale('log', {min: 1e-8, max: 1});
  assert.equal(s.unit(1e-8), 0);
  assert.equal(s.unit(1), 1);
  assert.ok(Math.abs(s.unit(1e-4) - 0.5) < 1e-12);
  assert.ok(Number.isNaN(s.unit(0)));
  assert.ok(Number.isNaN(s.unit(-1)));
  assert.equal(s.unit(1e-12), 0);
});

test('scales_widen_a_constant_domain', () => {
  const log = makeScale('log', {min: 0.01, max: 0.01});
  assert.ok(log.min < 0.01 && log.max > 0.01);
  assert.ok(Math.abs(log.unit(0.01) - 0.5) < 1e-12);
  const zeros = makeScale('linear', {min: 0, max: 0});
  assert.deepEqual([zeros.min, zeros.max, zeros.unit(0)], [0, 1, 0]);
  const constant = makeScale('linear', {min: 0.25, max: 0.25});
  assert.deepEqual([constant.min, constant.max, constant.unit(0.25)], [0, 0.25, 1]);
  assert.equal(makeScale('linear', {min: -2, max: -2}).unit(-2), 0);
  assert.equal(makeScale('linear', {min: 2, max: 4}).unit(3), 0.5);
});

test('log_ticks_are_powers_of_ten', () => {
  assert.deepEqual(logTicks(1e-8, 1, 9), [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1]);
  assert.deepEqual(logTicks(3e-9, 2, 9), [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1]);
});

test('log_ticks_thin_many_decades', () => {
  const t = logTicks(1e-30, 1e2, 7);
  assert.ok(t.length <= 7 && t.length >= 2);
  for (const v of t) assert.ok(Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-12, `${v}`);
});

test('log_ticks_narrow_range_uses_1_2_5', () => {
  assert.deepEqual(logTicks(0.15, 0.9), [0.2, 0.5]);
  assert.deepEqual(logTicks(0.04, 3, 7), [0.05, 0.1, 0.2, 0.5, 1, 2]);
  // Too many 1-2-5 ticks for maxTicks: decades instead.
  assert.deepEqual(logTicks(0.0011, 3, 5), [0.01, 0.1, 1]);
  const t = logTicks(0.31, 0.34);
  assert.ok(t.length >= 1 && t.every((v) => v >= 0.31 && v <= 0.34));
});

test('linear_ticks_are_nice_numbers', () => {
  assert.deepEqual(linearTicks(0, 1, 5), [0, 0.2, 0.4, 0.6, 0.8, 1]);
  assert.deepEqual(linearTicks(0, 0.3, 3), [0, 0.1, 0.2, 0.3]);
  assert.deepEqual(linearTicks(-3, 7, 5), [-2, 0, 2, 4, 6]);
  assert.deepEqual(linearTicks(13, 1000, 4), [200, 400, 600, 800, 1000]);
});

test('tick_labels_share_one_notation', () => {
  assert.deepEqual(formatTicks([1e-8, 1e-6, 1e-4, 1e-2, 1]), ['1e-8', '1e-6', '1e-4', '1e-2', '1e0']);
  assert.deepEqual(formatTicks([0, 0.5, 1]), ['0', '0.5', '1']);
  assert.deepEqual(formatTicks([0.001, 0.01, 0.1]), ['0.001', '0.01', '0.1']);
  assert.deepEqual(formatTicks([2e5, 4e5]), ['2e5', '4e5']);
});

test('step_ticks_cover_the_range_on_integer_steps', () => {
  const steps = Array.from({length: 300}, (_, i) => i);
  const t = stepTicks(steps, null, 6);
  assert.deepEqual(t.map((x) => x.step), [0, 50, 100, 150, 200, 250]);
  assert.equal(t[0].x, 0.5 / 300);
  assert.ok(Math.abs(t[2].x - 100.5 / 300) < 1e-12);
  assert.deepEqual(stepTicks([0, 1, 2], null, 6).map((x) => x.step), [0, 1, 2]);
  assert.deepEqual(stepTicks([7], null), [{step: 7, x: 0.5}]);
});

test('step_position_in_binned_and_sampled_columns', () => {
  // Two bins: steps 0-99 and 100-199.
  assert.ok(Math.abs(stepPosition([0, 100], [99, 199], 100) - 0.5025) < 1e-9);
  // Sampled: columns at steps 0 and 10; step 5 is halfway between centres.
  assert.equal(stepPosition([0, 10], null, 5), 0.5);
  assert.equal(columnOfStep([0, 10, 20], 15), 1);
  assert.equal(columnOfStep([0, 10, 20], -1), -1);
  assert.equal(columnOfStep([0, 10, 20], 25), 2);
});

test('bin_edges_cover_everything', () => {
  assert.deepEqual(Array.from(binEdges(10, 3)), [0, 3, 6, 10]);
  assert.deepEqual(Array.from(binEdges(3, 3)), [0, 1, 2, 3]);
});

test('downsample_keeps_a_single_cell_spike', () => {
  const g = grid(1, 1000, 1e-6);
  g.values[537] = 5;
  const d = downsampleGrid(g, 10, 1);
  assert.equal(d.cols, 10);
  assert.equal(d.values[5], 5);
  assert.equal(d.values[4], 1e-6);
  assert.equal(d.colEdges[5], 500);
});

test('downsample_keeps_a_single_nan_and_inf', () => {
  const g = grid(1, 1000, 0.5);
  g.values[123] = NaN;
  g.values[900] = Infinity;
  g.values[901] = NaN;
  g.values[450] = -Infinity;
  const d = downsampleGrid(g, 10, 1);
  assert.ok(Number.isNaN(d.values[1]));
  assert.ok(Number.isNaN(d.values[9]), 'NaN wins over Infinity in a bin');
  assert.equal(d.values[4], -Infinity);
  assert.equal(d.values[0], 0.5);
});

test('downsample_missing_only_when_the_whole_bin_is_missing', () => {
  const g = grid(1, 4, 2);
  g.missing.set([1, 1, 1, 0]);
  g.values.set([0, 0, 0, 2]);
  const d = downsampleGrid(g, 2, 1);
  assert.equal(d.missing[0], 1);
  assert.equal(d.missing[1], 0);
  assert.equal(d.values[1], 2);
});

test('downsample_rows_keeps_extremes_too', () => {
  const g = grid(100, 3, 1e-3);
  g.values[77 * 3 + 1] = 42;
  g.values[12 * 3 + 2] = NaN;
  const d = downsampleGrid(g, 3, 10);
  assert.equal(d.rows, 10);
  assert.equal(d.values[7 * 3 + 1], 42);
  assert.ok(Number.isNaN(d.values[1 * 3 + 2]));
  assert.equal(d.values[0], 1e-3);
});

test('downsample_status_keeps_mismatch', () => {
  const g = grid(1, 4, 1);
  g.status = new Uint8Array([1, 2, 1, 3]);
  const d = downsampleGrid(g, 2, 1);
  assert.deepEqual(Array.from(d.status), [2, 3]);
});

test('downsample_is_identity_when_it_fits', () => {
  const g = grid(3, 4);
  const d = downsampleGrid(g, 10, 10);
  assert.equal(d.values, g.values);
  assert.deepEqual(Array.from(d.colEdges), [0, 1, 2, 3, 4]);
});

test('colorize_uses_special_colours_and_lut_ends', () => {
  const g = grid(1, 6);
  g.values.set([1e-8, 1, 0, NaN, 1e-4, 0]);
  g.missing.set([0, 0, 0, 0, 0, 1]);
  const px = colorize(g, makeScale('log', {min: 1e-8, max: 1}));
  const at = (i) => Array.from(px.slice(i * 4, i * 4 + 3));
  assert.deepEqual(at(0), lutAt(0));
  assert.deepEqual(at(1), lutAt(255));
  assert.deepEqual(at(2), [...SPECIAL_COLORS.zero]);
  assert.deepEqual(at(3), [...SPECIAL_COLORS.nonfinite]);
  assert.deepEqual(at(4), lutAt(128));
  assert.deepEqual(at(5), [...SPECIAL_COLORS.missing]);
  const lin = colorize(g, makeScale('linear', {min: 0, max: 1}));
  assert.deepEqual(Array.from(lin.slice(8, 11)), lutAt(0), 'zero is on a linear scale');
});

test('format_value_is_exact_for_float32', () => {
  assert.equal(formatValue(Math.fround(1.2e-7)), '1.2e-7');
  assert.equal(formatValue(Math.fround(0.0031)), '0.0031');
  assert.equal(formatValue(Math.fround(1 / 3)), '0.33333334');
  assert.equal(formatValue(Math.fround(3.4028234663852886e38)), '3.4028235e38');
  assert.equal(formatValue(Math.fround(123456)), '123456');
  assert.equal(formatValue(Math.fround(-2.5e-12)), '-2.5e-12');
  assert.equal(formatValue(1 / 3), '0.3333333', 'a float64 value gets 7 digits');
  // Each shown string reads back as the same float32.
  for (const v of [1.2345678e-9, 0.1, 7.654321, 98765.43, 1e-45]) {
    const f = Math.fround(v);
    assert.equal(Math.fround(Number(formatValue(f))), f, `${v}`);
  }
});

test('format_value_names_special_values', () => {
  assert.equal(formatValue(null), 'missing (no gradient)');
  assert.equal(formatValue(NaN), 'NaN');
  assert.equal(formatValue(Infinity), 'Infinity');
  assert.equal(formatValue(-Infinity), '-Infinity');
  assert.equal(formatValue(0), '0');
});

test('shared_prefix_drops_only_whole_path_parts', () => {
  assert.equal(sharedPrefix(['sequential/dense', 'sequential/dense_1']), 'sequential/');
  assert.equal(sharedPrefix(['model/enc/a', 'model/enc/b', 'model/dec/c']), 'model/');
  assert.equal(sharedPrefix(['a/x', 'b/y']), '');
  assert.equal(sharedPrefix(['seq/a']), '');
  assert.equal(sharedPrefix(['seq/', 'seq/a']), '');
  assert.equal(sharedPrefix(['dense', 'dense_1']), '');
});

test('fit_label_cuts_the_middle', () => {
  const measure = (s) => s.length * 6;
  assert.equal(fitLabel('dense', 100, measure), 'dense');
  const long = 'encoder/block_11/attention/query/kernel';
  const cut = fitLabel(long, 120, measure);
  assert.ok(measure(cut) <= 120, cut);
  assert.ok(cut.includes('\u2026'));
  assert.ok(cut.endsWith('kernel'));
  assert.ok(cut.startsWith('enc'));
});

test('plot_height_clamps_row_height', () => {
  assert.deepEqual(plotHeight(12, 600), {rowHeight: 24, height: 288});
  assert.deepEqual(plotHeight(200, 600), {rowHeight: 4, height: 800});
  assert.deepEqual(plotHeight(50, 600), {rowHeight: 12, height: 600});
  const huge = plotHeight(2000, 600);
  assert.ok(huge.height <= 4000 && huge.rowHeight < 4);
});

test('parse_f32_heatmap_matches_the_json_form', () => {
  // 3 steps x 2 rows, step-major, as the server packs it (numpy '<f4' and packbits).
  const cells = [[Infinity, null], [NaN, 0.1], [3e-20, 2.5]];
  const bytes = new Uint8Array(6 * 4);
  const view = new DataView(bytes.buffer);
  const bits = new Uint8Array(1);
  cells.flat().forEach((v, k) => {
    if (v === null) bits[0] |= 1 << (7 - k);
    else view.setFloat32(k * 4, v, true);
  });
  const b64 = (u8) => btoa(String.fromCharCode(...u8));
  const packed = parseF32Heatmap({
    layers: ['a', 'b'], steps: [0, 1, 2], encoding: 'f32', values: null,
    values_f32: b64(bytes), missing_bits: b64(bits), status: null,
  });
  const json = parseHeatmap({
    layers: ['a', 'b'], steps: [0, 1, 2],
    values: [['Infinity', null], ['NaN', Math.fround(0.1)], [Math.fround(3e-20), 2.5]], status: null,
  });
  assert.deepEqual(Array.from(packed.missing), Array.from(json.missing));
  assert.deepEqual(Array.from(packed.values), Array.from(json.values));
  assert.equal(packed.values[1 * 3 + 1], Math.fround(0.1)); // row b, step 1
  assert.throws(() => parseF32Heatmap({layers: ['a'], steps: [0], values_f32: b64(new Uint8Array(3)), missing_bits: ''}),
    /Expected 1 float32 values/);
});
