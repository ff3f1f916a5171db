"""`GET runs` over a logdir of many large runs, both data paths, and the memory the plugin's cache holds.

100 runs of 200 layers x 2,000 written steps (``--quick``: 20 runs x 500
steps), served by TensorBoard's own WSGI app with the Rust data server and
with the Python multiplexer. One run is written by GradientWriter and its
event file hard-linked into every run directory: TensorBoard reads each as a
run of its own, and the disk holds it once.

Measured: the first ``GET runs`` (it reads every tag once), a repeated one
(after the listing's 2 s reuse has expired: what the tab's polling costs), one
heatmap request after the listing, and the bytes the plugin's one cache holds
after each. Baselines in the same run: the same requests on a logdir holding
one of those runs, and the decoded size of all runs (what a store that keeps
every run it has listed would hold).

``TB_GRADCHECK_LISTING_PATHS=rust`` (or ``python``) measures one data path only.
"""

import os
import statistics
import sys
import tempfile
import time

from benchmarks.backend import write_run
from benchmarks.common import row

LAYERS = 200
HEATMAP = "&metric=grad_norm&width=1200&encoding=f32"  # what the tab asks for


def _logdirs(root, runs, steps):
    """``(many, one)``: log directories of ``runs`` copies and of one copy of a written run."""
    template = os.path.join(root, "template")
    write_run(template, steps, LAYERS, run="run_000")
    files = os.listdir(os.path.join(template, "run_000"))
    many, one = os.path.join(root, "many"), os.path.join(root, "one")
    for parent, count in ((many, runs), (one, 1)):
        for i in range(count):
            run_dir = os.path.join(parent, f"run_{i:03d}")
            os.makedirs(run_dir)
            for name in files:
                os.link(os.path.join(template, "run_000", name), os.path.join(run_dir, name))
    return many, one


def _app(logdir, data_path):
    """``(werkzeug client, GradientsPlugin)`` over ``logdir``, built as ``tensorboard`` builds its app."""
    from tensorboard import program
    from tensorboard.backend import application
    from tensorboard.plugins.core import core_plugin
    from werkzeug import test as wtest

    from tb_gradcheck.reader.plugin import GradientsLoader

    class KeepPlugin(GradientsLoader):
        """The real loader; it also keeps the plugin it made, so its cache can be weighed."""

        def load(self, context):
            self.plugin = super().load(context)
            return self.plugin

    loader = KeepPlugin()
    # The core plugin defines --logdir and the other loading flags.
    tb = program.TensorBoard(plugins=[core_plugin.CorePluginLoader(), loader])
    argv = [
        None,
        "--logdir",
        logdir,
        "--reload_interval",
        "0",
        "--load_fast",
        {"rust": "true", "python": "false"}[data_path],
    ]
    if data_path == "python":
        argv += ["--reload_task", "blocking"]
    tb.configure(argv=argv)
    provider, multiplexer = tb._make_data_provider()
    app = application.TensorBoardWSGIApp(tb.flags, tb.plugin_loaders, provider, tb.assets_zip_provider, multiplexer)
    return wtest.Client(app), loader.plugin, provider


def _wait_loaded(provider, runs, steps, timeout=1200):
    """Until the data provider holds every run up to its last step (the Rust server loads in the background)."""
    from tensorboard import context

    deadline = time.time() + timeout
    while time.time() < deadline:
        listing = provider.list_tensors(context.RequestContext(), experiment_id="", plugin_name="gradients")
        done = [r for r, tags in listing.items() if tags and all(ts.max_step >= steps - 1 for ts in tags.values())]
        if len(done) >= runs:
            return
        time.sleep(0.5)
    raise RuntimeError(f"TensorBoard did not load {runs} runs of {steps} steps in {timeout} s")


def _get(client, url):
    started = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.data[:300]!r}")
    return elapsed, response


def _measure(logdir, data_path, runs, steps, repeats):
    client, plugin, provider = _app(logdir, data_path)
    _wait_loaded(provider, runs, steps)
    cold, response = _get(client, "/data/plugin/gradients/runs")
    listed = response.get_json()["runs"]
    if len(listed) != runs or any(e["granularities"]["layer"]["num_steps"] != steps for e in listed):
        raise RuntimeError(f"GET runs listed {len(listed)} runs, not {runs} of {steps} steps")
    after_listing = plugin._store.cache.nbytes
    warm = []
    for _ in range(repeats):
        time.sleep(2.1)  # past the listing's reuse: the provider is asked again, summaries come from the cache
        warm.append(_get(client, "/data/plugin/gradients/runs")[0])
    run = listed[len(listed) // 2]["run"]
    first_heatmap, _ = _get(client, f"/data/plugin/gradients/heatmap?run={run}{HEATMAP}")
    heatmaps = [_get(client, f"/data/plugin/gradients/heatmap?run={run}{HEATMAP}")[0] for _ in range(repeats)]
    return {
        "cold": cold,
        "warm": statistics.median(warm),
        "heatmap_first": first_heatmap,
        "heatmap": statistics.median(heatmaps),
        "cache_after_listing": after_listing,
        "cache_after_heatmap": plugin._store.cache.nbytes,
        "budget": plugin._store.cache.max_bytes,
    }


def run(quick=False):
    runs, steps, repeats = (20, 500, 3) if quick else (100, 2_000, 5)
    size = f"{runs} runs x {LAYERS} layers x {steps} steps"
    rows = []
    paths = [p for p in os.environ.get("TB_GRADCHECK_LISTING_PATHS", "rust,python").split(",") if p]
    with tempfile.TemporaryDirectory() as root:
        many, one = _logdirs(root, runs, steps)
        # What one run decodes to: float32 [steps, 1, 2 * LAYERS + 1, 5] plus its steps.
        decoded_run = steps * ((2 * LAYERS + 1) * 5 * 4 + 8)
        for label in paths:
            base = _measure(one, label, 1, steps, repeats)
            big = _measure(many, label, runs, steps, repeats)
            mib = 1 / (1 << 20)
            rows += [
                row(f"listing {label}: first GET runs, {size} vs 1 run", base["cold"], big["cold"], "s"),
                row(
                    f"listing {label}: repeated GET runs (listing re-read, summaries cached) vs 1 run",
                    base["warm"] * 1e3,
                    big["warm"] * 1e3,
                    "ms",
                ),
                row(
                    f"listing {label}: plugin cache after GET runs vs decoded size of every run",
                    runs * decoded_run * mib,
                    big["cache_after_listing"] * mib,
                    "MiB",
                ),
                row(
                    f"listing {label}: heatmap of one run after GET runs, first request vs with 1 run",
                    base["heatmap_first"] * 1e3,
                    big["heatmap_first"] * 1e3,
                    "ms",
                ),
                row(
                    f"listing {label}: heatmap of one run, repeated, vs with 1 run",
                    base["heatmap"] * 1e3,
                    big["heatmap"] * 1e3,
                    "ms",
                ),
                row(
                    f"listing {label}: plugin cache after the heatmap vs its budget",
                    big["budget"] * mib,
                    big["cache_after_heatmap"] * mib,
                    "MiB",
                    target=1.0,
                ),
            ]
    return rows


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    print_table(run(quick="--quick" in sys.argv))
