"""tf.distribute: MirroredStrategy on two logical CPUs and MultiWorkerMirroredStrategy with two worker processes.

The strategies run in subprocesses (tests/distribute_job.py): logical devices
must be configured before TensorFlow initialises its devices, and each worker
of a cluster is a process. The single-device reference runs the same
scenarios in this process, on the same global batches.
"""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import distribute_job as job
from benchmarks.common import free_port
from conftest import ROOT
from conftest import read_events
from tb_gradcheck.core import metadata

COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
GRAD_COLUMNS = [COL["grad_norm"], COL["grad_max_abs"], COL["weight_norm"]]
# Replicas add their half-batch gradients and the all-reduce adds the halves:
# the same float32 terms as one device, summed in another order. Each such
# reordering moves a result by a few ulp (eps = 1.2e-7) and six steps of SGD
# carry it into the weights; 1e-5 is 10-100x that, and 10^4 below a gradient
# counted twice or taken from one replica only (both off by 2x or more).
REORDER_RTOL = 1e-5
# The mixed-precision fit computes in float16 (eps 9.8e-4) on half batches.
FLOAT16_RTOL = 2e-2
# A hang must fail the test, not stall CI; a normal run takes well under a minute.
TIMEOUT_S = 240


def run_processes(kind, out, n=1):
    """Runs n copies of distribute_job.py (n > 1: a cluster on 127.0.0.1) and returns their JSON results."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(n)]}
    procs = []
    for i in range(n):
        if n > 1:
            env = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "distribute_job.py"), kind, str(out)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        tails = [p.communicate()[1][-3000:] for p in procs]
        pytest.fail(f"{kind} job did not finish within {TIMEOUT_S} s (hang?):\n" + "\n----\n".join(tails))
    for p, (_, stderr) in zip(procs, outputs):
        assert p.returncode == 0, f"{kind} job exited with {p.returncode}:\n{stderr[-5000:]}"
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]


def assert_same_records(run, reference, rtol, granularity="layer"):
    got, want = read_events(run, granularity=granularity), read_events(reference, granularity=granularity)
    assert [s for s, _, _ in got] == [s for s, _, _ in want]
    for (step, a, _), (_, b, _) in zip(got, want):
        np.testing.assert_allclose(a[..., GRAD_COLUMNS], b[..., GRAD_COLUMNS], rtol=rtol, err_msg=f"step {step}")
        np.testing.assert_array_equal(a[..., COL["grad_nonfinite"]], b[..., COL["grad_nonfinite"]])
    return got


def max_rel_diff(run, reference, granularity="variable"):
    a = np.stack([v[..., GRAD_COLUMNS] for _, v, _ in read_events(run, granularity=granularity)])
    b = np.stack([v[..., GRAD_COLUMNS] for _, v, _ in read_events(reference, granularity=granularity)])
    nonzero = b != 0
    return float(np.max(np.abs(a - b)[nonzero] / np.abs(b)[nonzero]))


def assert_close_weights(a, b, rtol):
    for x, y in zip(a, b):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=1e-7)


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    out = tmp_path_factory.mktemp("mirrored")
    ref = tmp_path_factory.mktemp("single")
    (result,) = run_processes("mirrored", out)
    single = tf.distribute.get_strategy()
    reference = {
        "custom_scope": job.custom_loop(single, str(ref / "custom_scope"), "writer"),
        "custom_window": job.custom_loop(single, str(ref / "custom_window"), "writer", every_n_steps=4),
        "custom_callback": job.custom_loop(single, str(ref / "custom_callback"), "callback"),
        "fit": job.fit(single, str(ref / "fit")),
        "fit_mixed": job.fit(single, str(ref / "fit_mixed"), mixed=True),
    }
    return out, ref, result, reference


def test_mirrored_custom_loop_records_the_summed_gradient_once_per_step(mirrored):
    out, ref, result, reference = mirrored
    # write() first ran inside strategy.run under strategy.scope(): its state
    # is plain variables, not MirroredVariables.
    assert result["custom_scope"][1] == ["ResourceVariable"]
    records = assert_same_records(out / "custom_scope", ref / "custom_scope", REORDER_RTOL)
    assert [s for s, _, _ in records] == list(range(1, job.STEPS + 1))  # one record per step, not per replica
    assert [int(v) for _, v, _ in read_events(out / "custom_scope", kind="progress")] == list(range(1, job.STEPS + 1))
    assert_close_weights(result["custom_scope"][0], reference["custom_scope"][0], REORDER_RTOL)


def test_per_replica_gradients_outside_strategy_run_are_rejected(mirrored):
    out, _, result, _ = mirrored
    assert "call write() inside `strategy.run`" in result["per_replica_error"]
    assert "Received: gradients[0] of type PerReplica" in result["per_replica_error"]
    assert not list((out / "per_replica").glob("events.*"))  # nothing written, no event file


def test_mirrored_window_state_is_updated_by_one_replica(mirrored):
    out, ref, _, _ = mirrored
    records = assert_same_records(out / "custom_window", ref / "custom_window", REORDER_RTOL)
    assert [s for s, _, _ in records] == [4, 6]  # a full window, then the partial one at close()
    # Were the window updated by both replicas, its sum would be twice the reference's.
    assert [int(v) for _, v, _ in read_events(out / "custom_window", kind="progress")] == [1, 2]


def test_mirrored_callback_in_a_custom_loop_records_the_optimizers_all_reduced_gradient(mirrored):
    out, ref, result, reference = mirrored
    records = assert_same_records(out / "custom_callback" / "train", ref / "custom_callback" / "train", REORDER_RTOL)
    assert [s for s, _, _ in records] == list(range(1, job.STEPS + 1))
    # Both recordings of the same training agree: the writer's own sum and the optimizer's.
    assert_same_records(out / "custom_callback" / "train", out / "custom_scope", REORDER_RTOL)


def test_mirrored_fit_records_the_applied_gradient_once_per_step(mirrored):
    out, ref, result, reference = mirrored
    for granularity in ("layer", "variable"):  # the Embedding's all-reduced IndexedSlices included
        records = assert_same_records(out / "fit" / "train", ref / "fit" / "train", REORDER_RTOL, granularity)
    assert [s for s, _, _ in records] == list(range(1, job.STEPS + 1))
    assert len(glob.glob(str(out / "fit" / "train" / "events.out.tfevents.*"))) == 1
    assert_close_weights(result["fit"], reference["fit"], REORDER_RTOL)


def test_mirrored_fit_with_mixed_precision_shows_the_skipped_step(mirrored):
    out, ref, _, _ = mirrored
    got = read_events(out / "fit_mixed" / "train", granularity="variable")
    want = read_events(ref / "fit_mixed" / "train", granularity="variable")
    assert [s for s, _, _ in got] == [s for s, _, _ in want] == list(range(1, job.STEPS + 1))
    for (step, a, _), (_, b, _) in zip(got, want):
        if step == 3:
            # The refused step: the first replica's unscaled gradient (the one the
            # LossScaleOptimizer checked), hidden layer overflowed.
            assert (a[0, :2, COL["grad_nonfinite"]] > 0).all() and (b[0, :2, COL["grad_nonfinite"]] > 0).all()
            continue
        np.testing.assert_allclose(
            a[..., GRAD_COLUMNS], b[..., GRAD_COLUMNS], rtol=FLOAT16_RTOL, err_msg=f"step {step}"
        )


def test_multi_worker_only_the_chief_writes_and_matches_one_process(tmp_path):
    results = run_processes("worker", tmp_path / "cluster", n=2)
    chief, other = sorted(results, key=lambda r: not r["chief"])
    assert chief["chief"] and not other["chief"]
    single = tf.distribute.get_strategy()
    for scenario in ("writer", "callback"):
        run = tmp_path / "cluster" / scenario
        run = run / "train" if scenario == "callback" else run
        files = [
            os.path.basename(p)
            for p in glob.glob(str(tmp_path / "cluster" / scenario / "**" / "events.out.tfevents.*"), recursive=True)
        ]
        assert len(files) == 1 and f".{chief['pid']}." in files[0], files  # none from the other worker

        weights, _ = job.custom_loop(single, str(tmp_path / "single" / scenario), scenario)
        ref = tmp_path / "single" / scenario
        ref = ref / "train" if scenario == "callback" else ref
        for granularity in ("layer", "variable"):
            records = assert_same_records(run, ref, REORDER_RTOL, granularity)
        assert [s for s, _, _ in records] == list(range(1, job.STEPS + 1))
        assert chief[scenario][0] == other[scenario][0]  # the workers trained the same model
        assert_close_weights(chief[scenario][0], weights, REORDER_RTOL)
        print(f"multi-worker {scenario}: max relative difference to one process {max_rel_diff(run, ref):.2e}")
