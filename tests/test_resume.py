"""A training killed (SIGKILL: no close) and resumed from its checkpoint in a new process, into the same run.

What TensorBoard shows through the plugin on both loaders, and what the
resumed writer says about the steps it writes again (core/run_directory.py,
core/earlier_steps.py).
"""

import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps
from tb_gradcheck.core import earlier_steps

JOB = pathlib.Path(__file__).resolve().parent / "resume_job.py"
ROOT = JOB.parent.parent


def _run(*args, killed=False):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(JOB.parent)]), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(JOB), *map(str, args)], capture_output=True, text=True, env=env)
    assert done.returncode == (-signal.SIGKILL if killed else 0), done.stderr[-3000:]
    norms = {int(s): float(v) for _, s, v in (line.split() for line in done.stdout.splitlines() if line[:5] == "norm ")}
    return norms, done.stderr


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    """Steps 0-13 by a process killed after step 13, 10-19 by one resumed from the checkpoint at step 10."""
    logdir = tmp_path_factory.mktemp("resume")
    run, ckpt = logdir / "run", logdir / "ckpt.pt"
    dead, _ = _run("torch", run, ckpt, 0, 20, 13, killed=True)
    resumed, said = _run("torch", run, ckpt, 10, 20)
    return logdir, dead, resumed, said


def test_a_resumed_writer_says_once_which_earlier_steps_tensorboard_drops(torch_run):
    logdir, dead, resumed, said = torch_run
    assert sorted(dead) == list(range(14)) and sorted(resumed) == list(range(10, 20))
    lines = [line for line in said.splitlines() if "earlier process" in line]
    assert lines == [
        f"tb_gradcheck: resuming the run {logdir / 'run'}: it holds gradient steps 0-13 written by an earlier "
        "process, and this process writes from step 10. TensorBoard shows this process's points from step 10 on "
        "and drops the earlier process's steps 10-13 (its rule for a job restarted from a checkpoint)."
    ], said
    assert "UserWarning" not in said  # a resume is what checkpoints are for: said, not warned


def test_a_run_started_again_from_step_0_in_a_used_directory_is_warned(torch_run, tmp_path):
    logdir, *_ = torch_run
    copy = tmp_path / "run"
    copy.mkdir()
    for f in (logdir / "run").iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    _, said = _run("torch", copy, tmp_path / "ckpt.pt", 0, 3)
    assert f"UserWarning: tb_gradcheck: {copy} already holds gradient steps 0-19 written by an earlier process" in said
    assert "give it a run directory of its own" in said and said.count("earlier process") == 1


def test_the_tab_shows_each_step_once_and_the_resumed_process_values_at_the_steps_written_again(torch_run, data_path):
    logdir, dead, resumed, _ = torch_run
    client, _ = make_app(logdir, data_path)
    wait_for_steps(client, "run", 20)
    heat = get_json(client, "/data/plugin/gradients/heatmap?run=run&metric=grad_norm&granularity=variable")
    assert heat["steps"] == list(range(20)) and heat["layers"][0] == "0.weight"
    expected = [resumed.get(s, dead.get(s)) for s in range(20)]
    np.testing.assert_allclose([row[0] for row in heat["values"]], expected, rtol=1e-5)
    assert not np.allclose(dead[12], resumed[12])  # the two processes' points differ where both wrote
    assert get_json(client, "/data/plugin/gradients/findings?run=run")["findings"] == []
    csv = client.get("/data/plugin/gradients/export?run=run&metric=grad_norm&granularity=variable").data.decode()
    assert [int(line.split(",")[0]) for line in csv.splitlines()[1:]] == list(range(20))


def test_a_keras_fit_resumed_by_backup_and_restore_says_what_is_dropped(tmp_path):
    _run("keras", tmp_path, 7, killed=True)  # epochs of 5 steps: the backup holds epoch 1, iterations 5
    _, said = _run("keras", tmp_path, -1)
    lines = [line for line in said.splitlines() if "earlier process" in line]
    assert len(lines) == 1 and "holds gradient steps 1-7" in lines[0], said
    assert "writes from step 6" in lines[0] and "drops the earlier process's steps 6-7" in lines[0]


def test_scan_reads_only_gradient_points_and_stops_at_a_record_cut_short(torch_run, tmp_path):
    logdir, *_ = torch_run
    [dead_file] = sorted((logdir / "run").iterdir())[:1]
    # Another writer's scalars in the run (a Trainer's loss) are not gradient steps.
    from torch.utils.tensorboard import SummaryWriter

    scalars = SummaryWriter(str(tmp_path))
    for step in range(50, 60):
        scalars.add_scalar("train/loss", 1.0, step)
    scalars.close()
    assert earlier_steps.scan(tmp_path) is None
    data = dead_file.read_bytes()
    (tmp_path / dead_file.name).write_bytes(data[: len(data) - 10])  # killed mid-write of step 13
    assert earlier_steps.scan(tmp_path) == (0, 12)
    assert earlier_steps.scan(tmp_path, skip=[tmp_path / dead_file.name]) is None
