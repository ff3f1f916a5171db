// Unit tests of frontend/api.js (node --test): URLs, stale responses, errors.
import {test} from 'node:test';
import assert from 'node:assert/strict';

import {Api, HttpError, LatestRequest, alignUrl, checksUrl, compareUrl, exportUrl, fetchJson, findingsUrl, heatmapUrl} from '../../frontend/api.js';

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

test('compare_and_window_urls_carry_alignment_and_ranges', () => {
  const url = compareUrl({run: 'a&b', other: 'c d', metric: 'grad_norm', granularity: 'layer', aggregate: 'max', width: 800.2, align: 'structure'});
  assert.equal(url, 'compare?run=a%26b&other=c+d&metric=grad_norm&granularity=layer&aggregate=max&width=800&align=structure&encoding=f32');
  const zoomed = heatmapUrl({run: 'r', metric: 'grad_norm', first_step: 100, last_step: 250, other: 'ignored', align: 'name'});
  assert.equal(zoomed, 'heatmap?run=r&metric=grad_norm&first_step=100&last_step=250&encoding=f32');
  assert.equal(findingsUrl('x/y'), 'findings?run=x%2Fy');
  assert.equal(checksUrl('x', 'layer'), 'checks?run=x&granularity=layer');
});

test('align_url_carries_the_pair_and_only_what_the_alignment_depends_on', () => {
  // The tab passes its whole selection: width, aggregate and zoom do not change which rows pair.
  const sel = {run: 'a&b', other: 'c d', metric: 'check_error', granularity: 'variable', aggregate: 'max', width: 800, align: 'auto'};
  assert.equal(alignUrl(sel), 'align?run=a%26b&other=c+d&granularity=variable&metric=check_error&align=auto');
});

test('api_fetches_relative_routes_one_channel_each', async () => {
  const calls = [];
  const f = async (url) => {
    calls.push(url);
    return {ok: true, json: async () => ({url})};
  };
  const api = new Api(f);
  assert.deepEqual(await api.runs(), {stale: false, value: {url: 'runs'}});
  const [a, b] = await Promise.all([api.get('main', 'heatmap?run=a'), api.get('other', 'heatmap?run=b')]);
  assert.equal(a.stale || b.stale, false);
  const first = api.get('main', 'heatmap?run=1');
  const second = api.get('main', 'heatmap?run=2');
  assert.deepEqual(await first, {stale: true});
  assert.equal((await second).value.url, 'heatmap?run=2');
  assert.deepEqual(calls, ['runs', 'heatmap?run=a', 'heatmap?run=b', 'heatmap?run=1', 'heatmap?run=2']);
});
