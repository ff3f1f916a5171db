"""Shared fixtures: TensorBoard's real data paths, a real TensorBoard process, the browser."""

import json
import os
import pathlib
import subprocess
import time
import urllib.error
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from benchmarks import common

ROOT = pathlib.Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"


def make_app(logdir, data_path, extra_flags=()):
    """TensorBoard's own WSGI app over ``logdir``, built the way ``tensorboard`` builds it.

    Args:
      logdir: The log directory.
      data_path: ``"python"`` (the multiplexer, ``--load_fast=false``) or
        ``"rust"`` (the tensorboard-data-server subprocess, the default).
      extra_flags: More command-line flags, e.g. ``["--samples_per_plugin", "gradients=50"]``.

    Returns:
      ``(werkzeug.test.Client, program.TensorBoard)``; the caller waits for
      data (``wait_for_steps``) since the Rust server loads asynchronously.
    """
    from tensorboard import default
    from tensorboard import program
    from tensorboard.backend import application
    from werkzeug import test as wtest

    from tb_gradcheck.reader.plugin import GradientsLoader

    load_fast = {"python": "false", "rust": "true"}[data_path]
    # default.get_plugins() is what `tensorboard` loads: first-party plugins plus
    # the tensorboard_plugins entry points, which must include ours.
    plugins = default.get_plugins()
    assert GradientsLoader in plugins, "the tensorboard_plugins entry point is not installed (pip install -e .)"
    tb = program.TensorBoard(plugins=plugins)
    argv = [None, "--logdir", str(logdir), "--load_fast", load_fast, "--reload_interval", "0"]
    if data_path == "python":
        argv += ["--reload_task", "blocking"]
    tb.configure(argv=argv + list(extra_flags))
    provider, multiplexer = tb._make_data_provider()
    app = application.TensorBoardWSGIApp(tb.flags, tb.plugin_loaders, provider, tb.assets_zip_provider, multiplexer)
    return wtest.Client(app), tb


def get_json(client, url, status=200):
    response = client.get(url)
    assert response.status_code == status, (url, response.status_code, response.data[:500])
    return json.loads(response.data) if status == 200 else response.data.decode()


def wait_for_steps(client, run, expected, granularity="layer", timeout=60):
    """Polls ``runs`` until ``run`` shows ``expected`` steps (the Rust server loads in the background)."""
    deadline = time.time() + timeout
    seen = None
    while time.time() < deadline:
        body = get_json(client, "/data/plugin/gradients/runs")
        for entry in body["runs"]:
            if entry["run"] == run and granularity in entry["granularities"]:
                seen = entry["granularities"][granularity]["num_steps"]
                if seen >= expected:
                    return entry
        time.sleep(0.2)
    raise AssertionError(f"run {run!r} never reached {expected} steps (last seen: {seen})")


@pytest.fixture(params=["python", "rust"])
def data_path(request):
    return request.param


class TensorBoardProcess:
    """A real ``tensorboard`` subprocess on 127.0.0.1."""

    def __init__(self, logdir, executable=None, extra_flags=(), env=None):
        self.port = common.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [executable] if executable else common.tensorboard_command()
        cmd = [*command, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = open(pathlib.Path(logdir).parent / f"tensorboard-{self.port}.log", "w+")
        self.proc = subprocess.Popen(cmd + list(extra_flags), stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"tensorboard exited with {self.proc.returncode}:\n{self.output()}")
            try:
                urllib.request.urlopen(self.url + "/data/plugins_listing", timeout=2).read()
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
        self.close()
        raise AssertionError(f"tensorboard did not answer within 90 s:\n{self.output()}")

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def get(self, path):
        """``(status, body bytes)`` of a GET, errors included."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get_json(self, path):
        status, body = self.get(path)
        assert status == 200, (path, status, body[:500])
        return json.loads(body)

    def wait_for_steps(self, run, expected, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for entry in self.get_json("/data/plugin/gradients/runs")["runs"]:
                if entry["run"] == run and entry["granularities"].get("layer", {}).get("num_steps", 0) >= expected:
                    return entry
            time.sleep(0.3)
        raise AssertionError(f"run {run!r} never reached {expected} steps:\n{self.output()[-3000:]}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def browser():
    """Headless Debian chromium through Playwright. CI installs it; a missing browser fails, never skips."""
    if os.environ.get("TB_GRADCHECK_SKIP_BROWSER") == "1":
        pytest.skip("TB_GRADCHECK_SKIP_BROWSER=1")
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium), as .ci/run does")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def artifacts():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def synthetic_run(logdir, steps, every_n_steps=1, names=("dense", "dense_1", "dense_2"), writer_kwargs=None):
    """Writes ``steps`` steps whose statistics are known in closed form.

    Layer ``j`` (a Keras Dense layer under model ``net``) gets a gradient with
    every element equal to ``scale(j, step) = (step + 1) * 10**-j``, so its
    ``grad_norm`` is ``sqrt(size_j) * scale(j, step)``.

    Returns:
      ``(sizes, scale)``: layer element counts, and the scale function.
    """
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    model = tf.keras.Sequential([tf.keras.Input((4,))] + [tf.keras.layers.Dense(3, name=n) for n in names], name="net")
    variables = model.trainable_variables
    sizes = [int(np.prod(model.get_layer(n).kernel.shape)) + 3 for n in names]

    def scale(j, step):
        return (step + 1) * 10.0**-j

    with GradientWriter(logdir, every_n_steps=every_n_steps, **(writer_kwargs or {})) as writer:

        @tf.function
        def step_fn(step):
            s = tf.cast(step + 1, tf.float32)
            grads = [tf.fill(v.shape, s * 10.0 ** -(i // 2)) for i, v in enumerate(variables)]
            writer.write(grads, variables, step)

        for step in range(steps):
            step_fn(tf.constant(step, tf.int64))
        assert step_fn.experimental_get_tracing_count() <= 2  # no retrace per step
    return sizes, scale


def next_second():
    """Waits for the clock's next second, before a test restarts a TensorFlow-written run in the same directory.

    TensorFlow names an event file by its second, then a per-process counter
    that is not zero-padded: a file opened in the same second as the
    process's tenth or hundredth sorts before it, and TensorBoard's Python
    loader, which reads a run's files in name order, skips it. A real
    restart is a later second (and process); the writers without TensorFlow
    pad their counter (``core/eventlog.py``).
    """
    second = int(time.time())
    while int(time.time()) == second:
        time.sleep(0.02)


def read_events(run_dir, kind="stats", granularity="layer"):
    """The gradient summaries of one run, as TensorBoard's event file loader reads them.

    Args:
      run_dir: The run directory.
      kind: ``"stats"`` (the ``[A, R, C]`` block of ``granularity``),
        ``"progress"`` (the header row's write count, a float) or
        ``"check"`` (the check tensors of ``granularity``).
      granularity: ``"layer"`` or ``"variable"``.

    Returns:
      A list of ``(step, numpy value, event file name)`` in file and record order.
    """
    import glob

    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util

    from tb_gradcheck.core import metadata

    contents, out = {}, []
    for path in sorted(glob.glob(os.path.join(str(run_dir), "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.content:
                    contents.setdefault(value.tag, metadata.parse(value.metadata.plugin_data.content))
                content = contents.get(value.tag)
                if content is None or not value.tag.startswith("gradients/"):
                    continue
                array = tensor_util.make_ndarray(value.tensor)
                if kind == "check" and content["kind"] == metadata.KIND_CHECK:
                    if content.get("granularity", granularity) == granularity:
                        out.append((event.step, array, os.path.basename(path)))
                elif kind in ("stats", "progress") and content["kind"] == metadata.KIND_STATS:
                    if kind == "progress":
                        array = float(array[0, metadata.header_row(content), 0])
                    else:
                        array = array[:, metadata.rows_of(content, granularity)[1]]
                    out.append((event.step, array, os.path.basename(path)))
    return out


def stats_content(run_dir):
    """The layout (row names) of the run's first stats tag."""
    import glob

    from tensorboard.backend.event_processing import event_file_loader

    from tb_gradcheck.core import metadata

    for path in sorted(glob.glob(os.path.join(str(run_dir), "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.tag.startswith("gradients/stats/") and value.metadata.plugin_data.content:
                    return metadata.parse(value.metadata.plugin_data.content)
    raise AssertionError(f"no stats tag in {run_dir}")


@pytest.fixture
def policy():
    """Restores Keras' global dtype policy, so a mixed-precision test leaves float32 behind."""
    import keras  # here, not at the top: only the tests that ask for this fixture need it

    previous = keras.mixed_precision.global_policy()
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy(previous)
