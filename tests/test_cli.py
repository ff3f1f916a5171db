"""`tb-gradcheck` as a user runs it: quiet start-up, a busy port refused before training, plain names in `report`.

Every command runs in a subprocess with TensorFlow's logging variables
removed from its environment, as a user's shell has them.
"""

import importlib.metadata
import json
import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

import tb_gradcheck
from benchmarks.common import free_port
from conftest import ROOT

EVIL = "\u202eevil"  # a right-to-left override inside a layer name
LAYERS = ["dense_0", "dense_1", EVIL, "out"]
QUIET_VARS = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MIN_VLOG_LEVEL", "GLOG_minloglevel")


def cli(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in QUIET_VARS}
    return subprocess.run(
        [sys.executable, "-m", "tb_gradcheck.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """One run whose first layers vanish (1e-12 gradients): dense_0, dense_1 and the hostile name are reported."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    logdir = tmp_path_factory.mktemp("cli")
    model = tf.keras.Sequential([tf.keras.Input((3,))] + [tf.keras.layers.Dense(3, name=n) for n in LAYERS], name="m")
    variables = model.trainable_variables
    with GradientWriter(logdir / "run") as writer:
        for step in range(20):
            scales = [1e-12 if v.path.split("/")[1] in LAYERS[:3] else 1.0 for v in variables]
            writer.write([tf.fill(v.shape, s) for v, s in zip(variables, scales)], variables, step)
    return logdir


def test_report_prints_nothing_on_stderr_no_tensorflow_start_up_noise(logdir):
    out = cli("report", logdir, "--fail-on", "warning")
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr == ""
    assert "vanishing" in out.stdout


def test_python_dash_m_tb_gradcheck_is_the_command_too(logdir):
    """``python -m tb_gradcheck`` where the venv's scripts are not on PATH: the same command, the same exit code."""
    env = {k: v for k, v in os.environ.items() if k not in QUIET_VARS}
    out = subprocess.run(
        [sys.executable, "-m", "tb_gradcheck", "report", str(logdir), "--fail-on", "warning"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 1 and "vanishing" in out.stdout and out.stderr == "", out.stderr[-2000:]


def test_report_text_names_layers_plainly_and_escapes_bidi_characters_visibly(logdir):
    out = cli("report", logdir)
    message = next(line for line in out.stdout.splitlines() if "Vanishing gradients in" in line)
    assert "m/dense_0, m/dense_1, m/\\u202eevil" in message  # grep 'dense_0,' finds it
    # Nothing invisible or reordering reaches the terminal, names included.
    assert not re.search("[\u2066-\u2069\u202a-\u202e\u200e\u200f]", out.stdout)
    assert "    - m/\\u202eevil: " in out.stdout


def test_a_reader_that_stops_early_ends_report_and_export_quietly(logdir):
    """`tb-gradcheck report | head -1`: the rest of the output has nowhere to go, which is no error of ours."""
    env = {k: v for k, v in os.environ.items() if k not in QUIET_VARS}
    for args in (["report", logdir], ["export", logdir, "--run", "run", "--metric", "grad_norm"]):
        process = subprocess.Popen(
            [sys.executable, "-m", "tb_gradcheck.cli", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        process.stdout.close()  # the reader is gone before the program's first write (its imports take longer)
        _, err = process.communicate(timeout=300)
        assert process.returncode == 141 and err == b"", (args, process.returncode, err.decode())


def test_report_json_keeps_exact_names_with_control_characters_as_json_escapes(logdir):
    out = cli("report", logdir, "--format", "json")
    assert out.returncode == 0 and out.stderr == ""  # a warning: the default gate fails on errors only
    assert not re.search("[\u2066-\u2069\u202a-\u202e]", out.stdout)  # escaped in the text ...
    assert "\\u202eevil" in out.stdout
    (finding,) = json.loads(out.stdout)["runs"]["run"]["findings"]
    assert finding["layers"] == ["m/dense_0", "m/dense_1", f"m/{EVIL}"]  # ... exact in the data
    assert f"m/dense_0, m/dense_1, m/{EVIL}" in finding["message"] and "\u2068" not in finding["message"]


def test_demo_on_a_busy_port_says_so_in_one_line_before_training(tmp_path):
    port = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        out = cli("demo", "--steps", "5", "--logdir", tmp_path / "logs", "--host", "127.0.0.1", "--port", port)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"tb-gradcheck demo: error: port {port} on 127.0.0.1 is already in use; choose another with --port"
    ]
    assert not (tmp_path / "logs").exists()  # refused before training, not after


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_demo_refuses_a_port_that_is_not_one(port):
    out = cli("demo", "--port", port)
    assert out.returncode == 2 and "--port: expected a port number" in out.stderr


def test_the_version_is_written_in_one_place_only():
    version = tb_gradcheck.__version__
    holders = [
        p.relative_to(ROOT).as_posix()
        for p in [ROOT / "setup.py", *sorted((ROOT / "tb_gradcheck").glob("*.py"))]
        if f'"{version}"' in p.read_text(encoding="utf-8")
    ]
    assert holders == ["tb_gradcheck/__init__.py"]
    assert importlib.metadata.version("tb_gradcheck") == version  # what pip installed agrees


def test_the_read_side_imports_no_tensorflow():
    modules = [
        "tb_gradcheck.reader.plugin",
        "tb_gradcheck.reader.queries",
        "tb_gradcheck.reader.store",
        "tb_gradcheck.reader.merge",
        "tb_gradcheck.cli",
        "tb_gradcheck",
    ]
    code = f"import sys; import {', '.join(modules)}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=pathlib.Path(__file__).parent
    )
    assert out.stdout.strip() == "[]"


def test_threshold_names_include_the_optimizer_findings(logdir):
    out = cli(
        "report",
        logdir,
        "--threshold",
        "clip_fraction=0.5",
        "--threshold",
        "not_learning_orders=4",
        "--fail-on",
        "warning",
    )
    assert out.returncode == 1 and out.stderr == "", out.stderr[-2000:]  # accepted: the same findings
    bad = cli("report", logdir, "--threshold", "no_such=1")
    assert bad.returncode == 2 and "clip_fraction" in bad.stderr and "vanishing_orders" in bad.stderr
