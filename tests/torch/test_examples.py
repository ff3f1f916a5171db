"""examples/torch_vanishing_or_wrong.py run as a user runs it, read back through the plugin; and the demo's PyTorch runs."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps

BASE = "/data/plugin/gradients"
STEPS = 41
# The gradient check lives in tb_gradcheck.torch.check; without it the example writes statistics only.
HAS_CHECK = importlib.util.find_spec("tb_gradcheck.torch.check") is not None


def _run(args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")  # tiny models, a shared 2-core machine
    out = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("torch_example")
    check_every = 20 if HAS_CHECK else 0
    script = ROOT / "examples" / "torch_vanishing_or_wrong.py"
    stdout = _run([script, "--logdir", logdir, "--steps", STEPS, "--check-every", check_every])
    return logdir, stdout


def test_vanishing_run_is_orders_below_and_the_wrong_one_looks_healthy(example):
    logdir, stdout = example
    assert "Wrote 3 runs" in stdout
    client, _ = make_app(logdir, "python")
    norms = {}
    for run in ("he_init", "small_init", "wrong_gradient"):
        entry = wait_for_steps(client, run, STEPS)
        assert entry["granularities"]["layer"]["rows"] == ["hidden", "output"]
        norms[run] = np.array(get_json(client, f"{BASE}/heatmap?run={run}&metric=grad_norm")["values"], float)
        assert "update_norm" in entry["metrics"]
    assert np.median(norms["small_init"]) < 1e-2 * np.median(norms["he_init"])
    ratio = np.median(norms["wrong_gradient"]) / np.median(norms["he_init"])
    assert 0.5 < ratio < 2.0


@pytest.mark.skipif(not HAS_CHECK, reason="tb_gradcheck.torch.check (the gradient check) is not in this tree")
def test_the_check_marks_the_planted_wrong_backward_and_nothing_else(example):
    logdir, _ = example
    client, _ = make_app(logdir, "python")
    for run in ("he_init", "small_init", "wrong_gradient"):
        wait_for_steps(client, run, STEPS)
        heat = get_json(client, f"{BASE}/heatmap?run={run}&metric=check_error&granularity=variable")
        assert heat["steps"] == [0, 20, 40]
        mismatched = {name for row in heat["status"] for name, s in zip(heat["layers"], row) if s == "mismatch"}
        assert mismatched == ({"output.weight"} if run == "wrong_gradient" else set()), (run, heat["status"])


def test_demo_writes_the_pytorch_runs(tmp_path):
    stdout = _run(
        ["-m", "tb_gradcheck.cli", "demo", "--framework", "torch", "--no-serve", "--steps", 120, "--logdir", tmp_path]
    )
    assert "Wrote 2 runs" in stdout
    client, _ = make_app(tmp_path, "python")
    wait_for_steps(client, "sigmoid", 120)
    heat = get_json(client, f"{BASE}/heatmap?run=sigmoid&metric=grad_norm")
    assert heat["layers"][0] == "dense_0" and heat["layers"][-1] == "logits" and len(heat["layers"]) == 11
    last = np.array(heat["values"][-1], float)
    assert np.log10(last[0] / last[-1]) < -3  # vanishing toward the input
    relu = np.array(get_json(client, f"{BASE}/heatmap?run=relu_he&metric=grad_norm")["values"][-1], float)
    assert abs(np.log10(relu[0] / relu[-1])) < 1.5
