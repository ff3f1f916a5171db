// Unit tests of the DOM-free helpers in frontend/views.js (node --test).
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {labelColumnWidth, labelStride} from '../../frontend/views.js';

test('label_stride_keeps_labels_apart_on_round_rows', () => {
  assert.equal(labelStride(24), 1);
  assert.equal(labelStride(12), 1);
  assert.equal(labelStride(8), 2);
  assert.equal(labelStride(4), 5);
  assert.equal(labelStride(2), 10);
  assert.equal(labelStride(0.4), 50);
});

test('label_column_width_fits_the_widest_label_within_bounds', () => {
  const measure = (s) => s.length * 6;
  assert.equal(labelColumnWidth(['a', 'dense_1'], measure, 280), 64);
  assert.equal(labelColumnWidth(['x'.repeat(20)], measure, 280), 134);
  assert.equal(labelColumnWidth(['x'.repeat(100)], measure, 280), 280);
});
