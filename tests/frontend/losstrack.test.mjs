// Unit tests of frontend/losstrack.js (node --test): decoding row 0 of both encodings, alignment, layout.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {TRACK_METRICS, firstRow, isTrackMetric, lossScaleTrack, trackLayout} from '../../frontend/losstrack.js';

// A heatmap response of `rows` identical rows per step, in the server's f32
// encoding (row-major steps x rows, numpy.packbits of the missing mask).
function f32Response(steps, column, rows = 3) {
  const values = new Float32Array(steps.length * rows);
  const bits = new Uint8Array(Math.ceil((steps.length * rows) / 8));
  column.forEach((v, c) => {
    for (let r = 0; r < rows; r++) {
      const i = c * rows + r;
      if (v === null) bits[i >> 3] |= 1 << (7 - (i & 7));
      else values[i] = v;
    }
  });
  return {
    steps, step_ends: null, layers: Array.from({length: rows}, (_, r) => `l${r}`), encoding: 'f32',
    values: null, values_f32: Buffer.from(values.buffer).toString('base64'),
    missing_bits: Buffer.from(bits).toString('base64'),
  };
}

test('track metrics are the two per-step series', () => {
  assert.deepEqual([...TRACK_METRICS], ['loss_scale', 'refused_steps']);
  assert.ok(isTrackMetric('loss_scale') && !isTrackMetric('update_norm'));
});

test('firstRow reads both encodings the same, missing as null', () => {
  const column = [1024, 512, null, 512];
  const json = {steps: [1, 2, 3, 4], layers: ['a', 'b'], encoding: 'json', values: column.map((v) => [v, v])};
  assert.deepEqual(firstRow(json), column);
  assert.deepEqual(firstRow(f32Response([1, 2, 3, 4], column)), column);
});

test('lossScaleTrack is null for a run whose steps have no scale, and refuses misaligned responses', () => {
  assert.equal(lossScaleTrack(f32Response([1, 2], [null, null]), null), null);
  assert.throws(() => lossScaleTrack(f32Response([1, 2], [8, 8]), f32Response([1], [0])), /same columns/);
});

test('trackLayout puts each point at its heatmap column centre and halvings one log2 step lower', () => {
  const track = lossScaleTrack(f32Response([1, 2, 3, 4], [1024, 1024, 512, 512]), f32Response([1, 2, 3, 4], [0, 1, 0, 0]));
  const layout = trackLayout(track, 400, 40, 0);
  assert.deepEqual(layout.points.map((p) => p.x), [50, 150, 250, 350]);
  assert.deepEqual(layout.points.map((p) => p.y), [0, 0, 40, 40]); // top = 1024, bottom = 512
  assert.deepEqual(layout.refused, [{x: 150, count: 1, step: 2}]);
  assert.equal(layout.top, 1024);
  assert.equal(layout.bottom, 512);
});
