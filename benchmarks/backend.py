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


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    print_table(run(quick="--quick" in sys.argv))
