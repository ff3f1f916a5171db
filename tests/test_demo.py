"""`tb-gradcheck demo`: real runs that show vanishing gradients, then a live TensorBoard."""

import re
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from benchmarks.common import free_port
from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps

STEPS = 150


@pytest.fixture(scope="module")
def demo_logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("demo")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tb_gradcheck.cli",
            "demo",
            "--no-serve",
            "--steps",
            str(STEPS),
            "--logdir",
            str(logdir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Wrote 2 runs" in out.stdout
    return logdir


def last_norms(client, run):
    body = get_json(client, f"/data/plugin/gradients/heatmap?run={run}&metric=grad_norm")
    return body["layers"], np.array(body["values"][-1], dtype=float)


def test_sigmoid_run_vanishes_toward_the_input_and_relu_he_does_not(demo_logdir):
    client, _ = make_app(demo_logdir, "python")
    wait_for_steps(client, "sigmoid", STEPS)
    layers, sigmoid = last_norms(client, "sigmoid")
    assert layers[0] == "mlp/dense_0" and layers[-1] == "mlp/logits" and len(layers) == 11
    _, relu = last_norms(client, "relu_he")
    # Input side over output side, in orders of magnitude.
    assert np.log10(sigmoid[0] / sigmoid[-1]) < -3, sigmoid
    assert abs(np.log10(relu[0] / relu[-1])) < 1.5, relu


def test_demo_starts_tensorboard_and_prints_the_tab_url(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tb_gradcheck.cli",
            "demo",
            "--steps",
            "20",
            "--logdir",
            str(tmp_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-browser",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = None
        deadline = time.time() + 180
        while time.time() < deadline and url is None:
            line = proc.stdout.readline()
            match = re.search(r"Gradients tab: (\S+)", line)
            if match:
                url = match.group(1)
            assert line or proc.poll() is None, "demo exited early"
        assert url == f"http://127.0.0.1:{port}/#gradients"
        listing = urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=30).read()
        assert b'"tab_name": "Gradients"' in listing
    finally:
        proc.terminate()
        proc.wait(20)
