"""Gradient checks through TensorBoard's real WSGI app, both data paths: runs, heatmap?metric=check_error, checks."""

import time

import numpy as np
import pytest
import tensorflow as tf

import check_models
from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps
from tb_gradcheck import GradientWriter
from tb_gradcheck import check_gradients

STEPS = 25
CHECK_EVERY = 10
BASE = "/data/plugin/gradients"


def _train(logdir, case, granularity):
    """Trains ``case`` with SGD, writing statistics every step and a check every CHECK_EVERY steps."""
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
    variables = case.variables
    reports = {}
    with GradientWriter(logdir) as writer:

        @tf.function
        def train_step(step):
            with tf.GradientTape() as tape:
                loss = case.loss()
            grads = tape.gradient(loss, variables)
            writer.write(grads, variables, step)
            optimizer.apply_gradients(zip(grads, variables))

        for step in range(STEPS):
            if step % CHECK_EVERY == 0 or step == STEPS - 1:
                reports[step] = check_gradients(case.loss, variables, seed=step, granularity=granularity)
                writer.write_check(reports[step], step)
            train_step(tf.constant(step, tf.int64))
    return reports


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("checks")
    wrong = _train(root / "wrong", check_models.mlp((4, 8, 8, 1), wrong_layer=1, factor=1.1).reseed(0), "variable")
    right = _train(root / "right", check_models.mlp((4, 8, 8, 1)).reseed(1), "layer")
    case = check_models.mlp((4, 8, 1)).reseed(2)
    with GradientWriter(root / "stats_only") as writer:
        writer.write([tf.ones_like(v) for v in case.variables], case.variables, 0)
    return root, {"wrong": wrong, "right": right}


def _client(logdir, data_path):
    client, _ = make_app(logdir, data_path)
    for run in ("wrong", "right"):
        wait_for_steps(client, run, STEPS)
        # The Rust server loads in the background: wait for the last check too.
        deadline = time.time() + 60
        while get_json(client, f"{BASE}/checks?run={run}")["num_steps"] < 4:
            assert time.time() < deadline, f"checks of {run!r} never all loaded"
            time.sleep(0.2)
    return client


def _statuses(reports, granularity):
    rows = lambda r: r.layers if granularity == "layer" else r.variables  # noqa: E731
    return [[row.status for row in rows(reports[s])] for s in sorted(reports)]


def test_runs_list_check_error_where_checks_were_written(logdir, data_path):
    root, _ = logdir
    client = _client(root, data_path)
    entries = {e["run"]: e for e in get_json(client, f"{BASE}/runs")["runs"]}
    assert "check_error" in entries["wrong"]["metrics"] and entries["wrong"]["aggregates"]["check_error"] == ["last"]
    assert entries["wrong"]["check_granularities"] == ["layer", "variable"]
    assert entries["right"]["check_granularities"] == ["layer"]
    assert "check_error" not in entries["stats_only"]["metrics"]
    assert entries["stats_only"]["check_granularities"] == []


@pytest.mark.parametrize("granularity", ["layer", "variable"])
def test_heatmap_check_error_serves_the_written_errors_and_statuses(logdir, data_path, granularity):
    root, reports = logdir
    client = _client(root, data_path)
    body = get_json(client, f"{BASE}/heatmap?run=wrong&metric=check_error&granularity={granularity}")
    wrong = reports["wrong"]
    steps = sorted(wrong)
    rows = [r.name for r in (wrong[0].layers if granularity == "layer" else wrong[0].variables)]
    assert body["steps"] == steps and body["layers"] == rows
    expected = [
        [
            float(np.float32(r.relative_error))
            for r in (wrong[s].layers if granularity == "layer" else wrong[s].variables)
        ]
        for s in steps
    ]
    assert body["values"] == expected  # float32 storage, exact round trip
    assert body["status"] == _statuses(wrong, granularity)
    # The layer with the wrong gradient is the one the tab marks, at every check.
    failing = {rows[j] for row in body["status"] for j, s in enumerate(row) if s == "mismatch"}
    assert failing == ({"mlp/dense_1"} if granularity == "layer" else {"mlp/dense_1/kernel", "mlp/dense_1/bias"})

    right = get_json(client, f"{BASE}/heatmap?run=right&metric=check_error")
    assert right["status"] == _statuses(reports["right"], "layer")
    assert all(s == "ok" for row in right["status"] for s in row)


def test_heatmap_binning_keeps_the_worst_status(logdir, data_path):
    root, _ = logdir
    client = _client(root, data_path)
    body = get_json(client, f"{BASE}/heatmap?run=wrong&metric=check_error&width=1")
    assert body["steps"] == [0] and body["step_ends"] == [STEPS - 1]
    assert body["status"] == [["ok", "mismatch", "ok"]]


def test_checks_route_gives_latest_rows_failures_and_history(logdir, data_path):
    root, reports = logdir
    client = _client(root, data_path)
    wrong = reports["wrong"]
    last = wrong[STEPS - 1]
    for granularity in ("layer", "variable"):
        body = get_json(client, f"{BASE}/checks?run=wrong&granularity={granularity}")
        rows = last.layers if granularity == "layer" else last.variables
        assert body["run"] == "wrong" and body["granularity"] == granularity
        assert body["step"] == STEPS - 1 and body["num_steps"] == len(wrong) and body["problems"] == []
        assert [c["name"] for c in body["rows"]] == [r.name for r in rows]
        for cell, row in zip(body["rows"], rows):
            assert cell["status"] == row.status
            for key in ("analytic", "numeric", "relative_error", "noise_floor"):
                assert cell[key] == float(np.float32(getattr(row, key))), key
        worst_first = sorted((r for r in rows if r.status == "mismatch"), key=lambda r: -r.relative_error)
        assert [c["name"] for c in body["failures"]] == [r.name for r in worst_first]
        assert body["failures"] and all(c["status"] == "mismatch" for c in body["failures"])
        by_name = {h["name"]: h for h in body["history"]}
        for j, name in enumerate(c["name"] for c in body["rows"]):
            seen = [s[j] for s in _statuses(wrong, granularity)]
            assert by_name[name]["checks"] == len(seen)
            assert {k: by_name[name][k] for k in ("ok", "inconclusive", "mismatch")} == {
                k: seen.count(k) for k in ("ok", "inconclusive", "mismatch")
            }
            hits = [s for s, status in zip(sorted(wrong), seen) if status == "mismatch"]
            assert by_name[name]["last_mismatch_step"] == (hits[-1] if hits else None)
    right = get_json(client, f"{BASE}/checks?run=right")
    assert right["failures"] == [] and {c["status"] for c in right["rows"]} == {"ok"}


def test_checks_route_errors(logdir, data_path):
    root, _ = logdir
    client = _client(root, data_path)
    cases = {
        "": (400, "'run'"),
        "?run=nope": (404, "'nope'"),
        "?run=stats_only": (404, "'stats_only' has no layer-level gradient checks"),
        "?run=right&granularity=variable": (404, "variable-level"),
        "?run=wrong&granularity=neuron": (400, "'neuron'"),
    }
    for query, (status, fragment) in cases.items():
        text = get_json(client, f"{BASE}/checks{query}", status=status)
        assert fragment in text, (query, text)
    text = get_json(client, f"{BASE}/heatmap?run=right&metric=check_error&granularity=variable", status=404)
    assert "variable-level" in text
