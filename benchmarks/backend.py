"""The plugin backend under a large run, through the real `tensorboard` process, both data paths.

A run of 200 layers x 10,000 written steps (``--quick``: 2,000). For each data
path (the Rust data server, TensorBoard's default, and ``--load_fast=false``):
time from process start to the first complete heatmap, p50/p99 of heatmap
requests once loaded (at the tab's typical width and unbinned), response
bytes, and TensorBoard's resident memory (the process and its data server).
Baselines measured in the same run: the scalars dashboard's own
``/data/plugin/scalars/tags`` route on the same TensorBoard (a request
TensorBoard itself makes on every page load), and the bytes of the unbinned
response.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchmarks.common import launch_tensorboard
from benchmarks.common import row

LAYERS = 200
TARGET_P50_MS = 250


def write_run(logdir, steps, layers=LAYERS, run="big"):
    """Writes a run of ``layers`` single-kernel layers x ``steps`` steps with GradientWriter (graph loop)."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    variables = [tf.Variable(tf.ones([4]), name=f"layer_{i:03d}") for i in range(layers)]
    scales = tf.constant([10.0 ** -(i / 40) for i in range(layers)])
    with GradientWriter(os.path.join(logdir, run)) as writer:

        @tf.function
        def write_all(start, count):
            for step in tf.range(start, start + count, dtype=tf.int64):
                wave = 1.0 + 0.5 * tf.sin(tf.cast(step, tf.float32) / 50.0)
                grads = [tf.fill([4], scales[i] * wave) for i in range(layers)]
                writer.write(grads, variables, step)

        chunk = 500
        for start in range(0, steps, chunk):
            write_all(tf.constant(start, tf.int64), tf.constant(min(chunk, steps - start), tf.int64))


def _get(url):
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
    return time.perf_counter() - start, body


def _rss_kib(pid):
    """Resident memory of a process and its children (the Rust data server), KiB."""
    total = 0
    pids = [str(pid)]
    try:
        out = subprocess.run(["ps", "-o", "pid=,ppid=,rss=", "-A"], capture_output=True, text=True).stdout
        table = [line.split() for line in out.splitlines() if line.strip()]
        frontier = {str(pid)}
        while frontier:
            children = {p for p, pp, _ in table if pp in frontier}
            pids += list(children)
            frontier = children
        total = sum(int(r) for p, _, r in table if p in pids)
    except (OSError, ValueError):
        pass
    return total


def _serve(logdir, steps, flags, requests):
    started = time.perf_counter()
    proc, base = launch_tensorboard(logdir, flags)
    try:
        heat = f"{base}/data/plugin/gradients/heatmap?run=big&metric=grad_norm"
        first = None
        while time.perf_counter() - started < 600:
            try:
                _, body = _get(heat + "&width=1200")
                if json.loads(body)["num_steps"] >= steps:
                    first = time.perf_counter() - started
                    break
            except OSError:
                pass
            time.sleep(0.25)
        if first is None:
            raise RuntimeError(f"tensorboard never served all {steps} steps ({flags})")
        binned, as_json, sizes = [], [], {}
        for _ in range(requests):
            elapsed, body = _get(heat + "&width=1200&encoding=f32")  # what the tab asks for
            binned.append(elapsed)
            sizes["binned"] = len(body)
        for _ in range(max(3, requests // 10)):
            elapsed, body = _get(heat + "&width=1200")
            as_json.append(elapsed)
            sizes["json"] = len(body)
        full = []
        for _ in range(max(3, requests // 10)):
            elapsed, body = _get(heat)
            full.append(elapsed)
            sizes["full"] = len(body)
        tags = [_get(f"{base}/data/plugin/scalars/tags")[0] for _ in range(requests)]
        return first, binned, as_json, full, tags, sizes, _rss_kib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def _p(samples, q):
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(round(q * (len(samples) - 1))))]


def run(quick=False):
    return run_layers(quick) + run_scale(quick)


def run_layers(quick=False):
    """200 layers x 10,000 steps through a real `tensorboard`, both data paths."""
    steps = 2_000 if quick else 10_000
    requests = 20 if quick else 100
    rows = []
    with tempfile.TemporaryDirectory() as logdir:
        write_run(logdir, steps)
        for label, flags in (("rust", []), ("python", ["--load_fast", "false"])):
            first, binned, as_json, full, tags, sizes, rss = _serve(logdir, steps, flags, requests)
            base = statistics.median(tags) * 1e3
            rows.append(
                row(f"backend {label}: first complete heatmap after start ({LAYERS}x{steps})", None, first, "s")
            )
            rows.append(
                row(
                    f"backend {label}: heatmap p50, width=1200 f32 (the tab's request), vs scalars/tags",
                    base,
                    statistics.median(binned) * 1e3,
                    "ms",
                    limit=TARGET_P50_MS,
                )
            )
            rows.append(row(f"backend {label}: heatmap p99, width=1200 f32", base, _p(binned, 0.99) * 1e3, "ms"))
            rows.append(
                row(f"backend {label}: heatmap p50, width=1200 json", base, statistics.median(as_json) * 1e3, "ms")
            )
            rows.append(
                row(
                    f"backend {label}: heatmap p50, unbinned json ({steps} columns)",
                    base,
                    statistics.median(full) * 1e3,
                    "ms",
                )
            )
            rows.append(
                row(
                    f"backend {label}: response bytes, width=1200 f32 vs unbinned json",
                    sizes["full"],
                    sizes["binned"],
                    "B",
                )
            )
            rows.append(
                row(
                    f"backend {label}: response bytes, width=1200 json vs unbinned json",
                    sizes["full"],
                    sizes["json"],
                    "B",
                )
            )
            rows.append(row(f"backend {label}: TensorBoard resident memory", None, rss / 1024, "MiB"))
    return rows


# --- a long run of 2,000 rows, opened and polled while it grows -------------------

TARGET_FIRST_LOOK_S = 5.0  # issue 29: first heatmap of 2,000 x 10,000 within 5 s of TensorBoard loading
TARGET_POLL_S = 0.5  # issue 29: a poll that finds 100 new steps
POLL_STEPS = 100


def _provider(logdir, label):
    """TensorBoard's own data provider over ``logdir``, every point kept, loaded; ``(provider, stop)``."""
    from tensorboard import context
    from tensorboard.data import server_ingester
    from tensorboard.util import grpc_util

    from tb_gradcheck.core import metadata
    from tb_gradcheck.reader import store

    if label == "python":
        st, _, _ = store.local_store(logdir)
        return st._provider, lambda: None
    ingester = server_ingester.SubprocessServerDataIngester(
        server_ingester.get_server_binary(),
        str(logdir),
        reload_interval=0,
        channel_creds_type=grpc_util.ChannelCredsType.LOCAL,
        samples_per_plugin={metadata.PLUGIN_NAME: 0},
    )
    ingester.start()
    provider, seen, deadline = ingester.data_provider, None, time.time() + 600
    while time.time() < deadline:  # the data server loads in the background
        listing = provider.list_tensors(context.RequestContext(), experiment_id="", plugin_name=metadata.PLUGIN_NAME)
        now = sorted((tag, ts.max_step) for tags in listing.values() for tag, ts in tags.items())
        if now and now == seen:
            break
        seen = now
        time.sleep(2)
    # The data server runs with --die-after-stdin: closing its stdin stops it.
    return provider, ingester._stdin_handle.close


def _floor(provider, tags=None):
    """Seconds the provider takes to hand over every point of every gradient tag (or of ``tags``): what any read pays."""
    from tensorboard import context
    from tensorboard.data import provider as tb_provider

    from tb_gradcheck.core import metadata
    from tb_gradcheck.reader import points

    ctx = context.RequestContext()
    listing = provider.list_tensors(ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME)
    started = time.perf_counter()
    for run, series in listing.items():
        for tag, ts in series.items():
            if tags is not None and tag not in tags:
                continue
            limit = points.read_limit(metadata.parse(ts.plugin_content))
            flt = tb_provider.RunTagFilter(runs=[run], tags=[tag])
            provider.read_tensors(
                ctx, experiment_id="", plugin_name=metadata.PLUGIN_NAME, run_tag_filter=flt, downsample=limit
            )
    return time.perf_counter() - started


def _grow(logdir, first_step, spans):
    """Writes ``POLL_STEPS`` more steps of the 2,000-row run, in a process of its own, as a training job would."""
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]; from benchmarks.frontend import write_transformer; "
        f"write_transformer(sys.argv[3], {POLL_STEPS}, first_step={first_step}, spans={spans})"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(
        [sys.executable, "-c", code, root, os.path.join(root, "tests"), str(logdir)],
        check=True,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def _last_tags(provider):
    """The tags holding the newest step of each layout: its one tag, or its newest span."""
    from tensorboard import context

    from tb_gradcheck.core import metadata

    listing = provider.list_tensors(context.RequestContext(), experiment_id="", plugin_name=metadata.PLUGIN_NAME)
    newest = max(ts.max_step for tags in listing.values() for ts in tags.values())
    return {tag for tags in listing.values() for tag, ts in tags.items() if ts.max_step == newest}


def _scale_rows(label, logdir, steps, spans, polls):
    """First look and polls of the 2,000-row run on one data path: ``[row]``."""
    from benchmarks.frontend import BIG_ROWS
    from benchmarks.frontend import _serving

    flags = ["--reload_interval", "1"] + (["--load_fast", "false"] if label == "python" else [])
    proc, base = launch_tensorboard(logdir, flags)
    run = f"{base}/data/plugin/gradients/"
    heat = run + "heatmap?run=transformer&metric=grad_norm&granularity=layer&aggregate=last&width=1652&encoding=f32"
    try:
        _serving(base, "loading", "transformer", steps)  # loaded; nothing read for the default experiment yet
        started = time.perf_counter()
        _get(run + "runs")
        _, body = _get(heat)
        first = time.perf_counter() - started
        assert json.loads(body)["num_steps"] == steps
        found, times = [], []
        for k in range(polls):
            _grow(logdir, steps + POLL_STEPS * k, spans)
            time.sleep(3)  # TensorBoard reloads every second
            started = time.perf_counter()
            _get(run + "runs")
            _, body = _get(heat)
            times.append(time.perf_counter() - started)
            found.append(json.loads(body)["num_steps"] - steps - POLL_STEPS * k)
        rss = _rss_kib(proc.pid) / 1024
    finally:
        proc.terminate()
        proc.wait(30)
    provider, stop = _provider(logdir, label)
    try:
        floor = _floor(provider)
        floor_poll = _floor(provider, _last_tags(provider))
    finally:
        stop()
    layout = "span tags (what GradientWriter writes)" if spans else "one tag per layout (writers before spans)"
    what = f"{BIG_ROWS:,} rows x {steps:,} steps, {layout}"
    return [
        row(
            f"scale {label}: first look (runs + heatmap) after TensorBoard loaded, {what}, vs the provider handing over every point",
            floor,
            first,
            "s",
            limit=TARGET_FIRST_LOOK_S,
        ),
        row(
            f"scale {label}: poll that finds {POLL_STEPS} new steps (runs + heatmap), median of {polls} "
            f"(steps found: {found}), {what}, vs the provider handing over the changed tags",
            floor_poll,
            statistics.median(times),
            "s",
            limit=TARGET_POLL_S,
        ),
        row(f"scale {label}: TensorBoard resident memory after the polls, {what}", None, rss, "MiB"),
    ]


def run_scale(quick=False, before=True):
    """The 2,000-row run (``benchmarks.frontend.write_transformer``): first look and polls, both data paths.

    Written as GradientWriter writes it (span tags, ``tags.tag_for``) and,
    unless ``before`` is False, as writers before spans wrote it (one tag per
    layout), to compare.
    """
    from benchmarks.frontend import write_transformer

    steps, polls = (1_000, 2) if quick else (10_000, 3)
    rows = []
    for spans in (True, False) if before else (True,):
        for label in ("rust", "python"):
            with tempfile.TemporaryDirectory() as logdir:
                write_transformer(logdir, steps, spans=spans)
                rows += _scale_rows(label, logdir, steps, spans, polls)
    return rows


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    quick = "--quick" in sys.argv
    print_table(run_scale(quick) if "--scale" in sys.argv else run(quick))
