"""Load: concurrent HTTP clients against a live `tensorboard` serving a large gradient run.

Reusable pieces (tests/reader/test_load.py uses them, with no timed assertion):

- ``write_large_run(logdir, layers, steps)``: a run written by the real
  ``GradientWriter`` in one ``tf.function`` loop.
- ``request_mix(run)``: the requests the Gradients tab and its users make,
  weighted (runs polling, heatmaps at canvas widths, findings, compare,
  the occasional export).
- ``measure(base_url, mix, clients, requests_per_client)``: every latency,
  status and decoded body digest.
- ``run(quick=False)``: all of it against a fresh `tensorboard` subprocess,
  returning ``benchmarks.common.row`` dicts ``{name, baseline, value, ratio,
  unit, target, ...}``; the baseline of a latency is the same request mix
  from one client alone, so ``ratio`` says how much 16-way concurrency
  slows a request down.

Run it directly: ``python -m benchmarks.load [--layers 200 --steps 2000]``,
or with the others once "load" is in ``benchmarks/__main__.py``'s MODULES.
"""

import argparse
import collections
import gzip
import hashlib
import json
import os
import pathlib
import random
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from benchmarks.common import launch_tensorboard

BASE = "/data/plugin/gradients/"


def write_large_run(logdir, layers=200, steps=2000, run="large"):
    """Writes ``steps`` steps of ``layers`` one-variable layers; returns the run's directory.

    Layer ``i``'s gradient is ``(step + 1) * (i + 1)`` everywhere, so every
    value is known. One ``tf.function`` holds the whole loop, so writing
    costs graph execution only (about 10 s for 200 x 2,000 on one core).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    variables = [tf.Variable(tf.ones([4]), name=f"net/layer_{i:03d}") for i in range(layers)]
    path = pathlib.Path(logdir) / run
    with GradientWriter(path) as writer:

        @tf.function
        def write_all(n):
            for step in tf.range(n, dtype=tf.int64):
                s = tf.cast(step + 1, tf.float32)
                writer.write([tf.fill([4], s * (i + 1)) for i in range(layers)], variables, step)

        write_all(tf.constant(steps, tf.int64))
    return path


def request_mix(run="large", width=1200, downloads=True):
    """``[(weight, path)]``: what the tab sends (runs polling, heatmaps at canvas widths) and what users add.

    Args:
      run: The run to ask for.
      width: The widest canvas, in device pixels (the tab asks for its
        canvas width; others get a fraction of it). A heatmap costs about
        width x rows in JSON encoding and gzip, inside TensorBoard's one
        Python process, so this sets the load.
      downloads: Include the CSV export of the whole matrix (3 in 100
        requests), by far the most expensive request (about 0.5 s of CPU for
        2,000 x 200 values).
    """
    q = urllib.parse.quote(run, safe="")
    # The tab asks for packed float32 heatmaps; other clients (scripts) take the JSON default.
    heat = f"{BASE}heatmap?run={q}&granularity=layer&encoding=f32"
    mix = [
        (10, f"{BASE}runs"),
        (30, f"{heat}&metric=grad_norm&width={width}"),
        (10, f"{BASE}heatmap?run={q}&metric=grad_norm&width={width // 4}&reduce=mean"),
        (10, f"{heat}&metric=grad_zero_fraction&width={width * 2 // 3}"),
        (10, f"{BASE}heatmap?run={q}&granularity=variable&metric=grad_to_weight&width={width // 2}&encoding=f32"),
        (10, f"{BASE}findings?run={q}"),
        (5, f"{BASE}compare?run={q}&other={q}&metric=grad_norm&width={width // 3}"),
        (2, f"{BASE}static/index.js"),
    ]
    if downloads:
        mix.append((3, f"{BASE}export?run={q}&metric=grad_max_abs&format=csv"))
    return mix


def _fetch(url, timeout):
    """``(status, decoded body bytes)``; gzip is asked for and undone, as a browser would."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, body, encoding = response.status, response.read(), response.headers.get("Content-Encoding")
    except urllib.error.HTTPError as e:
        status, body, encoding = e.code, e.read(), e.headers.get("Content-Encoding")
    if encoding == "gzip":
        body = gzip.decompress(body)
    return status, body


def measure(base_url, mix, clients=16, requests_per_client=100, timeout=120, seed=0):
    """Runs ``clients`` threads, each sending ``requests_per_client`` requests drawn from ``mix``.

    Returns:
      A dict: ``latencies`` (seconds, sorted), ``statuses`` (Counter),
      ``errors`` (``[(path, status or exception text)]`` for anything not
      200), ``digests`` (``{path: set of body SHA-256}``: a path whose
      body differs between requests over unchanged data means a race),
      ``wall_s``, ``requests``.
    """
    weights, paths = zip(*mix)
    lock = threading.Lock()
    latencies, statuses, errors = [], collections.Counter(), []
    digests = collections.defaultdict(set)

    def client(k):
        rng = random.Random(seed * 1000 + k)
        for path in rng.choices(paths, weights, k=requests_per_client):
            start = time.perf_counter()
            try:
                status, body = _fetch(base_url + path, timeout)
            except Exception as e:  # a dropped connection or a timeout is an error, not a crash of the run
                status, body = f"{type(e).__name__}: {e}", b""
            elapsed = time.perf_counter() - start
            fresh = False
            with lock:
                latencies.append(elapsed)
                statuses[status] += 1
                if status != 200:
                    errors.append((path, status))
                else:
                    digest = hashlib.sha256(body).hexdigest()
                    fresh = digest not in digests[path]
                    digests[path].add(digest)
            if status == 200 and fresh and "static/" not in path and "format=csv" not in path:
                json.loads(body)  # each distinct body is well-formed JSON (checked once, outside the lock)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "latencies": sorted(latencies),
        "statuses": statuses,
        "errors": errors,
        "digests": dict(digests),
        "wall_s": wall,
        "requests": len(latencies),
    }


def percentile(sorted_values, q):
    """The ``q``-th percentile (0..100) by the nearest-rank method."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def rows(loaded, alone, clients=16):
    """Benchmark rows (``benchmarks.common.row``) from two ``measure`` results.

    ``alone`` is the same mix from a single client: each latency's baseline,
    so a ratio says how much concurrency slows a request. No latency has a
    target (it depends on the machine); errors must be zero, which is the
    one row with a verdict (``met``).
    """
    from benchmarks.common import row

    lat, base = loaded["latencies"], alone["latencies"]
    errors = row(
        f"load {clients}x: errors (non-200 or dropped)", len(alone["errors"]), len(loaded["errors"]), "responses"
    )
    errors["met"] = not loaded["errors"] and not alone["errors"]
    return [
        row(f"load {clients}x: requests", alone["requests"], loaded["requests"], "requests"),
        errors,
        row(f"load {clients}x: p50 latency", percentile(base, 50) * 1000, percentile(lat, 50) * 1000, "ms"),
        row(f"load {clients}x: p99 latency", percentile(base, 99) * 1000, percentile(lat, 99) * 1000, "ms"),
        row(
            f"load {clients}x: throughput",
            alone["requests"] / alone["wall_s"],
            loaded["requests"] / loaded["wall_s"],
            "requests/s",
            lower_is_better=False,
        ),
    ]


def start_tensorboard(logdir, extra_flags=(), wait_steps=None, run="large", timeout=120):
    """A `tensorboard` subprocess on 127.0.0.1 that imports this checkout's tb_gradcheck; returns ``(proc, url)``."""
    proc, url = launch_tensorboard(logdir, extra_flags)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            status, body = _fetch(url + BASE + "runs", 5)
            entries = {e["run"]: e for e in json.loads(body)["runs"]} if status == 200 else {}
            steps = entries.get(run, {}).get("granularities", {}).get("layer", {}).get("num_steps", 0)
            if wait_steps is None or steps >= wait_steps:
                return proc, url
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"tensorboard on {url} did not serve {run!r} within {timeout} s")


def run(quick=False, layers=200, steps=2000, clients=16, requests_per_client=100, baseline_requests=50):
    """Writes a large run, serves it with a fresh `tensorboard`, and returns the benchmark rows.

    ``quick``: 50 layers x 500 steps and 20 requests per client, a smoke run.
    """
    if quick:
        layers, steps, requests_per_client, baseline_requests = 50, 500, 20, 20
    with tempfile.TemporaryDirectory() as logdir:
        write_large_run(logdir, layers, steps)
        proc, url = start_tensorboard(logdir, wait_steps=steps)
        try:
            mix = request_mix()
            alone = measure(url, mix, clients=1, requests_per_client=baseline_requests, seed=1)
            loaded = measure(url, mix, clients=clients, requests_per_client=requests_per_client)
        finally:
            proc.terminate()
            proc.wait(30)
    return rows(loaded, alone, clients)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=100, help="per client")
    args = parser.parse_args(argv)
    for r in run(layers=args.layers, steps=args.steps, clients=args.clients, requests_per_client=args.requests):
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
