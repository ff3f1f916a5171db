// Unit tests of frontend/model.js (node --test): URLs, stale responses,
// selection, errors and the status line.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {
  Api, HttpError, LatestRequest, aggregatesOf, exportUrl, fetchJson, heatmapUrl, metricLabel, reconcileSelection, statusParts,
} from '../../frontend/model.js';

const RUNS = [
  {
    run: 'sigmoid',
    metrics: ['grad_norm', 'grad_max_abs', 'grad_nonfinite'],
    aggregates: {grad_norm: ['last'], grad_nonfinite: ['last']},
    window: 1,
    granularities: {
      layer: {rows: ['sequential/dense', 'sequential/dense_1'], num_steps: 300, first_step: 0, last_step: 299},
      variable: {rows: ['sequential/dense/kernel'], num_steps: 300, first_step: 0, last_step: 299},
    },
    total_steps: 300,
    sampled: false,
    problems: [],
  },
  {
    run: 'windowed',
    metrics: ['grad_max_abs', 'check_error'],
    aggregates: {grad_max_abs: ['last', 'mean', 'max', 'min']},
    window: 10,
    granularities: {layer: {rows: ['d'], num_steps: 100, first_step: 0, last_step: 990}},
    total_steps: 500,
    sampled: true,
    problems: [],
  },
];

function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return {promise, resolve, reject};
}

test('heatmap_url_is_relative_and_encodes_names', () => {
  const url = heatmapUrl({run: 'a b&c/d', metric: 'grad_norm', granularity: 'layer', aggregate: null, width: 1200.4});
  assert.equal(url, 'heatmap?run=a+b%26c%2Fd&metric=grad_norm&granularity=layer&width=1200&encoding=f32');
  assert.ok(!url.startsWith('/'));
  const params = new URLSearchParams(url.split('?')[1]);
  assert.equal(params.get('run'), 'a b&c/d');
  assert.equal(params.has('aggregate'), false);
  assert.equal(new URLSearchParams(heatmapUrl({run: 'r', metric: 'm', width: 1e9}).split('?')[1]).get('width'), '100000');
  assert.match(heatmapUrl({run: 'r', metric: 'm', aggregate: 'max'}), /aggregate=max/);
});

test('export_url_is_relative_and_names_the_selection', () => {
  assert.equal(
    exportUrl({run: 'a&b', metric: 'grad_norm', granularity: 'variable', aggregate: 'max'}),
    'export?run=a%26b&metric=grad_norm&granularity=variable&aggregate=max&format=csv',
  );
  assert.equal(exportUrl({run: 'r', metric: 'check_error', aggregate: null}, 'json'), 'export?run=r&metric=check_error&format=json');
});

test('reconcile_selection_keeps_what_is_still_valid', () => {
  const sel = reconcileSelection(RUNS, {run: 'sigmoid', metric: 'grad_max_abs', granularity: 'variable'});
  assert.deepEqual(sel, {run: 'sigmoid', metric: 'grad_max_abs', granularity: 'variable', aggregate: null});
});

test('reconcile_selection_falls_back_per_field', () => {
  assert.deepEqual(reconcileSelection(RUNS, {}), {run: 'sigmoid', metric: 'grad_norm', granularity: 'layer', aggregate: 'last'});
  // The run is gone: first run. The metric is not in this run: its first.
  assert.deepEqual(
    reconcileSelection(RUNS, {run: 'gone', metric: 'weight_norm'}),
    {run: 'sigmoid', metric: 'grad_norm', granularity: 'layer', aggregate: 'last'},
  );
  // Variable granularity is not offered by "windowed": back to layer.
  assert.deepEqual(
    reconcileSelection(RUNS, {run: 'windowed', metric: 'grad_max_abs', granularity: 'variable', aggregate: 'max'}),
    {run: 'windowed', metric: 'grad_max_abs', granularity: 'layer', aggregate: 'max'},
  );
  assert.equal(reconcileSelection(RUNS, {run: 'windowed', metric: 'grad_max_abs', aggregate: 'sum'}).aggregate, 'last');
  assert.equal(reconcileSelection([], {}), null);
});

test('aggregates_of_a_metric_without_list_is_empty', () => {
  assert.deepEqual(aggregatesOf(RUNS[1], 'check_error'), []);
  assert.deepEqual(aggregatesOf(RUNS[1], 'grad_max_abs'), ['last', 'mean', 'max', 'min']);
});

test('latest_request_drops_a_response_that_arrives_late', async () => {
  const latest = new LatestRequest();
  const first = deferred();
  const second = deferred();
  const signals = [];
  const p1 = latest.run((signal) => (signals.push(signal), first.promise));
  const p2 = latest.run((signal) => (signals.push(signal), second.promise));
  assert.equal(signals[0].aborted, true, 'starting a new request aborts the old one');
  second.resolve('new');
  first.resolve('old');
  assert.deepEqual(await p2, {stale: false, value: 'new'});
  assert.deepEqual(await p1, {stale: true});
});

test('latest_request_swallows_errors_of_stale_requests_only', async () => {
  const latest = new LatestRequest();
  const first = deferred();
  const p1 = latest.run(() => first.promise);
  const p2 = latest.run(() => Promise.reject(new Error('boom')));
  first.reject(new Error('aborted'));
  assert.deepEqual(await p1, {stale: true});
  await assert.rejects(p2, /boom/);
});

test('latest_request_cancel_makes_in_flight_stale', async () => {
  const latest = new LatestRequest();
  const d = deferred();
  const p = latest.run(() => d.promise);
  latest.cancel();
  d.resolve(1);
  assert.deepEqual(await p, {stale: true});
});

function fakeFetch(routes) {
  const calls = [];
  const impl = async (url) => {
    calls.push(url);
    const [status, body] = routes(url);
    return {
      ok: status >= 200 && status < 300,
      status,
      statusText: status === 404 ? 'Not Found' : status === 400 ? 'Bad Request' : 'OK',
      json: async () => JSON.parse(body),
      text: async () => body,
    };
  };
  impl.calls = calls;
  return impl;
}

test('fetch_json_turns_a_4xx_text_body_into_the_error_message', async () => {
  const f = fakeFetch(() => [404, "No run named 'nope'\n"]);
  await assert.rejects(fetchJson('heatmap?run=nope&metric=grad_norm', undefined, f), (err) => {
    assert.ok(err instanceof HttpError);
    assert.equal(err.status, 404);
    assert.equal(err.message, "404 Not Found: No run named 'nope'");
    return true;
  });
});

test('api_fetches_relative_routes', async () => {
  const f = fakeFetch((url) => (url === 'runs' ? [200, '{"runs": [], "samples_per_plugin": 0}'] : [200, '{}']));
  const api = new Api(f);
  assert.deepEqual(await api.runs(), {stale: false, value: {runs: [], samples_per_plugin: 0}});
  await api.heatmap({run: 'r', metric: 'grad_norm', granularity: 'layer', width: 640});
  assert.deepEqual(f.calls, ['runs', 'heatmap?run=r&metric=grad_norm&granularity=layer&width=640&encoding=f32']);
});

test('metric_label_names_known_metrics', () => {
  assert.equal(metricLabel('grad_norm'), 'gradient norm (grad_norm)');
  assert.equal(metricLabel('something_new'), 'something_new');
});

function resp(extra) {
  return {
    run: 'sigmoid', metric: 'grad_norm', granularity: 'layer', aggregate: 'last',
    layers: ['a', 'b', 'c'], steps: [0, 1, 2], step_ends: null, values: [], status: null,
    num_steps: 3, total_steps: 3, reduce: null, ...extra,
  };
}

test('status_line_counts_steps_and_rows', () => {
  const parts = statusParts(RUNS[0], resp(), {cols: 3, rows: 3});
  assert.deepEqual(parts.map((p) => p.text), ['3 steps (0\u20132)', '3 layers']);
  const one = statusParts(RUNS[0], resp({layers: ['kernel'], granularity: 'variable', steps: [5], num_steps: 1}), {cols: 1, rows: 1});
  assert.deepEqual(one.map((p) => p.text), ['1 step', '1 variable']);
});

test('status_line_says_sampled_and_binned', () => {
  const r = resp({steps: [0, 500], step_ends: [499, 990], num_steps: 100, total_steps: 500, reduce: 'max'});
  const text = statusParts(RUNS[1], r, {cols: 2, rows: 3}).map((p) => p.text).join(' | ');
  assert.match(text, /showing 100 of 500 steps \(TensorBoard sampled this series; start it with --samples_per_plugin gradients=0 to keep all\)/);
  assert.match(text, /binned to 2 columns \(max per bin\)/);
  assert.match(text, /written every 10 training steps, last of each window/);
  assert.match(text, /100 steps \(0\u2013990\)/);
});

test('status_line_says_client_side_binning', () => {
  const steps = Array.from({length: 5000}, (_, i) => i);
  const text = statusParts(RUNS[0], resp({steps, num_steps: 5000}), {cols: 1200, rows: 3}).map((p) => p.text);
  assert.ok(text.includes('binned to 1,200 columns (max per bin)'), text.join(' | '));
});

test('status_line_says_row_binning', () => {
  const layers = Array.from({length: 5000}, (_, i) => `l${i}`);
  const text = statusParts(RUNS[0], resp({layers}), {cols: 3, rows: 4000}).map((p) => p.text);
  assert.deepEqual(text, ['3 steps (0\u20132)', '5,000 layers', 'rows binned to 4,000 (max per bin)']);
});
