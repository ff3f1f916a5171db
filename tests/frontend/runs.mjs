// The `runs` answer the controller's unit tests start from (state, changes, load).

// Two runs as the runs route lists them (docs/http_api.md); `checked` has gradient checks.
export const RUNS = [
  {
    run: 'sigmoid', metrics: ['grad_norm', 'grad_max_abs'], aggregates: {grad_norm: ['last'], grad_max_abs: ['last']},
    window: 1, granularities: {layer: {rows: ['mlp/dense_0', 'mlp/dense_1']}, variable: {rows: ['mlp/dense_0/kernel']}},
    last_write: 10, total_steps: 200,
  },
  {
    run: 'checked', metrics: ['grad_norm', 'grad_nonfinite', 'check_error'],
    aggregates: {grad_norm: ['last', 'max'], grad_nonfinite: ['last', 'max']}, window: 5,
    granularities: {layer: {rows: ['mlp/dense_0', 'mlp/dense_1'], metrics: ['grad_norm', 'grad_nonfinite', 'check_error']}},
    last_write: 20, total_steps: 100,
  },
];
