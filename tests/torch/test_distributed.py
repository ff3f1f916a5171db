"""DDP and FSDP2 on 2 gloo processes write what one process writes for the same model, weights and batches.

tests/torch_distributed_job.py trains the same network three ways (one
process; DDP; FSDP2, every parameter a DTensor sharded on its first axis,
7 units split 4 and 3), with a window of 2, ``clip_grad_norm_``, the
optimizer's update and a NaN planted on one shard. Rank 0 writes; FSDP2's
whole-parameter statistics come from one all-reduce of the shards' at each
written step. A stacked experts weight ``[experts, out, in]`` sharded by expert
has its (expert, output) units counted across the shards.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.common import free_port
from conftest import ROOT
from conftest import read_events
from conftest import stats_content

JOB = ROOT / "tests" / "torch_distributed_job.py"
# Two processes sum and average the gradient in another order than one: float32 rounding apart.
RTOL = 2e-5


def _run(mode, logdir):
    # One intra-op thread per process: two processes of tiny models on a shared 2-core machine.
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1"
    )
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, str(JOB), mode, str(logdir), str(free_port())],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        # The free port can be taken by a test running beside this one before rank 0 listens on it.
        if out.returncode == 0 or "address already in use" not in out.stderr.lower():
            break
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("single")
    _run("single", logdir)
    return logdir


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_write_what_one_process_writes(single, tmp_path, mode):
    _run(mode, tmp_path)
    files = list(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 1  # rank 0 alone opened an event file
    content, twin = stats_content(tmp_path), stats_content(single)
    assert content == twin  # the same rows, sizes and columns: the same tag
    for granularity in ("layer", "variable"):
        got, want = read_events(tmp_path, "stats", granularity), read_events(single, "stats", granularity)
        assert [s for s, _, _ in got] == [s for s, _, _ in want] == [0, 2, 4]
        for (step, a, _), (_, b, _) in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-7, err_msg=f"{mode} {granularity} step {step}")
    columns = content["columns"]
    variables = content["variable"]["rows"]
    _, at_4, _ = read_events(tmp_path, "stats", "variable")[2]
    # The NaN planted at step 3 (on rank 1's shard under FSDP2) is the window's first non-finite step.
    offset = at_4[:, variables.index("hidden.weight"), columns.index("first_nonfinite_offset")]
    assert (offset == 1.0).all()
    assert at_4[:, variables.index("head.weight"), columns.index("first_nonfinite_offset")][0] == 0.0  # Adam spread it
    dead = at_4[0, variables.index("embed.weight"), columns.index("dead_unit_fraction")]
    assert 0.0 <= dead <= 1.0
    # Stacked experts [3, 7, 7], sharded by expert: one dead (expert, output) unit of 21, on rank 1's shard.
    _, at_0, _ = read_events(tmp_path, "stats", "variable")[0]
    assert at_0[0, variables.index("experts.weight"), columns.index("dead_unit_fraction")] == np.float32(1 / 21)
