"""The examples, run as scripts the way a user runs them, and what they write read back through the plugin."""

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


def run_example(name, *args):
    # PYTHONPATH: this checkout's tb_gradcheck, not whichever one is installed.
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def vanishing_or_wrong(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("vanishing_or_wrong")
    stdout = run_example("vanishing_or_wrong.py", "--logdir", logdir, "--steps", 41, "--check-every", 20)
    return logdir, stdout


def test_vanishing_or_wrong_writes_norms_and_per_variable_checks_the_tab_shows(vanishing_or_wrong, data_path):
    logdir, stdout = vanishing_or_wrong
    assert "Wrote 3 runs" in stdout and "== wrong_gradient: last check (step 40) ==" in stdout
    client, _ = make_app(logdir, data_path)
    for run in ("he_init", "small_init", "wrong_gradient"):
        entry = wait_for_steps(client, run, 41)
        assert entry["granularities"]["layer"]["rows"] == [f"{run}/hidden", f"{run}/output"]
        assert {"grad_norm", "check_error"} <= set(entry["metrics"])
        assert entry["check_granularities"] == ["layer", "variable"]
        heat = get_json(client, f"{BASE}/heatmap?run={run}&metric=check_error&granularity=variable")
        assert heat["steps"] == [0, 20, 40]
        assert heat["layers"] == [
            f"{run}/{v}" for v in ("hidden/kernel", "hidden/bias", "output/kernel", "output/bias")
        ]

    def norms(run):
        return np.array(get_json(client, f"{BASE}/heatmap?run={run}&metric=grad_norm")["values"], float)

    def statuses(run):
        return get_json(client, f"{BASE}/heatmap?run={run}&metric=check_error&granularity=variable")["status"]

    # Vanishing: the norms show it (more than an order of magnitude below the
    # healthy run at every step and layer; ~100x for the hidden layer), the
    # check does not call it wrong.
    assert np.all(norms("small_init") < norms("he_init") / 10)
    assert "mismatch" not in sum(statuses("small_init"), [])
    # Wrong: the norms look healthy (within 20% of he_init's), the check
    # marks the output kernel, and only it, at every check.
    assert np.allclose(norms("wrong_gradient"), norms("he_init"), rtol=0.2)
    assert [row[2] for row in statuses("wrong_gradient")] == ["mismatch"] * 3
    assert all(s != "mismatch" for row in statuses("wrong_gradient") for j, s in enumerate(row) if j != 2)
    assert all(s == "ok" for row in statuses("he_init") for s in row)
    checks = get_json(client, f"{BASE}/checks?run=wrong_gradient&granularity=variable")
    assert [c["name"] for c in checks["failures"]] == ["wrong_gradient/output/kernel"]
    assert checks["failures"][0]["relative_error"] == pytest.approx(0.05, rel=0.1)  # the injected 5%


def test_vanishing_or_wrong_reasons_name_the_real_cause(vanishing_or_wrong):
    # "below the noise floor" only where the derivative is below it; a
    # derivative far above its floor whose error bar still exceeds the
    # tolerance says so (the small_init/output/bias: 2.37e-1 against
    # a floor of 3.24e-3 was called "below the noise floor").
    _, stdout = vanishing_or_wrong
    rows = [
        line.split()
        for line in stdout.splitlines()
        if line.split()[:1]
        and "/" in line.split()[0]
        and len(line.split()) >= 8
        and line.split()[7] in ("ok", "inconclusive", "mismatch")
    ]
    assert len(rows) >= 18  # 3 runs x (2 layers + 4 variables)
    for row in rows:
        analytic, numeric, floor = float(row[1]), float(row[2]), float(row[5])
        reason = " ".join(row[8:])
        if "noise floor" in reason:
            assert max(abs(analytic), abs(numeric)) <= floor, row
        if row[7] == "inconclusive":
            assert reason, row


def test_symbolic_vs_numeric_prints_both_comparisons_per_variable(tmp_path):
    stdout = run_example("symbolic_vs_numeric.py", "--logdir", tmp_path / "run", "--steps", 20, "--check-every", 10)
    variables = [f"relu_net/{layer}/{v}" for layer in ("dense_0", "dense_1", "output") for v in ("kernel", "bias")]
    check_part, compute_part = stdout.split("tf.test.compute_gradient, full Jacobians")
    for name in variables:
        line = next(line for line in check_part.splitlines() if line.startswith(name + " "))
        analytic, numeric, difference = (float(x) for x in line.split()[1:4])
        # Printed with 6 significant digits (the derivatives) and 3 (the
        # difference): recomputing it from the printed derivatives is good to
        # 1e-5 of their size.
        assert difference == pytest.approx(abs(analytic - numeric), rel=0.01, abs=1e-5 * abs(analytic))
        # Columns: name, analytic, numeric, difference, rel. error, noise floor, catches >=, status.
        assert line.split()[7] in ("ok", "inconclusive")  # a correct ReLU network: never a mismatch
        row = next(line for line in compute_part.splitlines() if line.startswith(name + " "))
        assert float(row.split()[2]) >= 0 and row.split()[-1] == line.split()[7]
    assert "462 in all" in compute_part  # 2 evaluations x 231 parameters
    client, _ = make_app(tmp_path, "python")
    wait_for_steps(client, "run", 20)
    checks = get_json(client, f"{BASE}/checks?run=run&granularity=variable")
    assert checks["step"] == 20 and checks["num_steps"] == 3 and checks["failures"] == []
    assert [c["name"] for c in checks["rows"]] == variables
