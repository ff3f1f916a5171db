"""The whole program: a plain `pip install .` into a fresh venv, then the real `tensorboard` over HTTP.

The venv has no TensorFlow and no editable install: only what `pip install .`
pulls in. So this catches a broken entry point, missing frontend files in
the wheel, an install_requires gap, and a TensorFlow import in the plugin.
"""

import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT
from conftest import TensorBoardProcess
from conftest import synthetic_run

STEPS = 2000


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = subprocess.run(
        [str(path / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    check = subprocess.run(
        [
            str(path / "bin" / "python"),
            "-c",
            "import importlib.util, tb_gradcheck.reader.plugin, sys; print(importlib.util.find_spec('tensorflow') is None, "
            "tb_gradcheck.reader.plugin._frontend_dir())",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=path,  # not the checkout: import the installed copy
    )
    no_tf, frontend = check.stdout.split()
    assert no_tf == "True", "the fresh venv should not have TensorFlow"
    assert "site-packages/tb_gradcheck/frontend" in frontend, frontend
    return path


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tb") / "logs"
    sizes, scale = synthetic_run(path / "train", STEPS)
    return path, sizes, scale


@pytest.mark.parametrize("load_fast", ["auto", "false"], ids=["rust_default", "python"])
def test_installed_tensorboard_serves_the_gradients_tab(venv, logdir, load_fast):
    path, sizes, scale = logdir
    flags = [] if load_fast == "auto" else ["--load_fast", "false"]
    tb = TensorBoardProcess(path, executable=str(venv / "bin" / "tensorboard"), extra_flags=flags)
    try:
        listing = tb.get_json("/data/plugins_listing")
        assert listing["gradients"]["enabled"] is True
        assert listing["gradients"]["tab_name"] == "Gradients"
        status, body = tb.get("/data/plugin/gradients/static/index.js")
        assert status == 200 and b"render" in body

        entry = tb.wait_for_steps("train", STEPS)
        assert entry["granularities"]["layer"]["rows"] == ["net/dense", "net/dense_1", "net/dense_2"]
        assert entry["sampled"] is False and entry["total_steps"] == STEPS

        heat = tb.get_json("/data/plugin/gradients/heatmap?run=train&metric=grad_norm")
        assert heat["steps"] == list(range(STEPS))
        expected = [np.sqrt(sizes[j]) * scale(j, STEPS - 1) for j in range(3)]
        np.testing.assert_allclose(heat["values"][-1], expected, rtol=1e-6)

        for query, code in [
            ("heatmap?metric=grad_norm", 400),
            ("heatmap?run=train&metric=grad_norm&width=-3", 400),
            ("heatmap?run=ghost&metric=grad_norm", 404),
            ("heatmap?run=train&metric=bogus", 404),
            ("static/..%2F..%2Fsetup.py", 404),
        ]:
            status, text = tb.get("/data/plugin/gradients/" + query)
            assert status == code, (query, status, text)
        log = tb.output()
    finally:
        tb.close()
    # The default path must really be the Rust server (TensorBoard says so when it starts it).
    assert ("Using experimental fast data loading logic" in log) == (load_fast == "auto"), log
    assert "Traceback" not in log, log
