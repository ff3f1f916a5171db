"""The JAX example, run as a script the way a user runs it, and what it writes read back through the plugin."""

import pathlib
import subprocess
import sys

import numpy as np

from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = "/data/plugin/gradients"


def test_jax_vanishing_or_wrong_shows_vanishing_norms_and_the_wrong_vjps_layer(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "jax_vanishing_or_wrong.py"),
            "--logdir",
            str(tmp_path),
            "--steps",
            "21",
            "--check-every",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "wrong_vjp: last check {'hidden': 'mismatch', 'output': 'ok'}" in out.stdout
    assert "small_init: last check {'hidden': 'ok', 'output': 'ok'}" in out.stdout
    client, _ = make_app(tmp_path, "python")
    for run in ("he_init", "small_init", "wrong_vjp"):
        entry = wait_for_steps(client, run, 21)
        assert entry["granularities"]["layer"]["rows"] == ["hidden", "output"]
        assert {"grad_norm", "check_error", "update_norm"} <= set(entry["metrics"])
        assert get_json(client, f"{BASE}/heatmap?run={run}&metric=check_error")["steps"] == [0, 10, 20]

    def norms(run):
        return np.array(get_json(client, f"{BASE}/heatmap?run={run}&metric=grad_norm")["values"], float)

    # Vanishing: every layer's norm far below the healthy run's at every step,
    # the hidden layer's (whose gradient scales with the output weights) most.
    assert np.all(norms("small_init") < norms("he_init") / 20)
    assert np.all(norms("small_init")[:, 0] < norms("he_init")[:, 0] / 50)
    # Wrong: norms as healthy as he_init's (same scale), the check says where.
    assert np.all(norms("wrong_vjp") > norms("he_init") / 3)
    status = get_json(client, f"{BASE}/heatmap?run=wrong_vjp&metric=check_error")["status"]
    assert status == [["mismatch", "ok"]] * 3
