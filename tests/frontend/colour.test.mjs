// Unit tests of frontend/colour.js (node --test): lookup tables, special
// colours, scales and colouring.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  LUT_SIZE, MIN_RATIO_DECADES, RATIO_LUT, RATIO_SPECIAL_COLORS, SPECIAL_COLORS, VIRIDIS_LUT, buildViridisLut, colorize,
  makeRatioScale, makeScale, ratioDecades, valueDomain,
} from '../../frontend/colour.js';

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

const ratioAt = (i) => Array.from(RATIO_LUT.slice(i * 4, i * 4 + 3));

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

test('ratio_lut_is_blue_below_white_at_one_red_above', () => {
  assert.equal(RATIO_LUT.length, LUT_SIZE * 4);
  const [r0, , b0] = ratioAt(0);
  const [r1, , b1] = ratioAt(LUT_SIZE - 1);
  assert.ok(b0 > r0 + 100, 'low end is blue');
  assert.ok(r1 > b1 + 100, 'high end is red');
  for (const c of [...ratioAt(127), ...ratioAt(128)]) assert.ok(c >= 240, 'centre is near white');
  // Special colours of the ratio map are none of its own colours.
  for (const special of Object.values(RATIO_SPECIAL_COLORS)) {
    for (let i = 0; i < LUT_SIZE; i++) {
      const d = ratioAt(i).reduce((s, c, k) => s + Math.abs(c - special[k]), 0);
      assert.ok(d > 60, `special ${special} is close to LUT entry ${i}`);
    }
  }
});

test('ratio_scale_is_symmetric_in_decades_and_has_a_floor', () => {
  assert.equal(ratioDecades([1e-3, 10, 1], null), 3);
  assert.equal(ratioDecades([1.01, 0.99], null), MIN_RATIO_DECADES);
  assert.equal(ratioDecades([0, Infinity, NaN, 1e9], new Uint8Array([0, 0, 0, 1])), MIN_RATIO_DECADES);
  const s = makeRatioScale(3);
  assert.equal(s.kind, 'log');
  assert.ok(s.diverging);
  assert.ok(Math.abs(s.unit(1) - 0.5) < 1e-12);
  assert.ok(Math.abs(s.unit(1e-3)) < 1e-12 && Math.abs(s.unit(1e3) - 1) < 1e-12);
  assert.ok(Math.abs(s.unit(10) - (1 - s.unit(0.1))) < 1e-12);
});

test('colorize_uses_the_ratio_scale_lut_and_specials', () => {
  const g = {rows: 1, cols: 5, values: Float64Array.from([1e-3, 1, 1e3, NaN, 0]), missing: Uint8Array.from([0, 0, 0, 0, 0])};
  const px = colorize(g, makeRatioScale(3));
  const at = (i) => Array.from(px.slice(i * 4, i * 4 + 3));
  assert.deepEqual(at(0), ratioAt(0));
  assert.deepEqual(at(2), ratioAt(255));
  assert.ok(at(1).every((c) => c >= 240));
  assert.deepEqual(at(3), [...RATIO_SPECIAL_COLORS.nonfinite]);
  assert.deepEqual(at(4), [...RATIO_SPECIAL_COLORS.zero]);
  // The plain log scale still uses viridis and the usual specials.
  const plain = colorize(g, makeScale('log', {min: 1e-3, max: 1e3}));
  assert.deepEqual(Array.from(plain.slice(12, 15)), [...SPECIAL_COLORS.nonfinite]);
});
