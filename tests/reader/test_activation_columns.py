"""Activation columns through TensorBoard's data providers, the routes and ``export``; logs without them read as before.

Three runs written by ``tb_gradcheck.torch.GradientWriter``: ``new`` with
``activations=True``, ``old`` without (the stored format before activation
columns existed: the same bytes as before), and ``both``: written without,
then continued with them (two layouts in one run, merged by row name).
"""

import csv
import io

import numpy as np
import pytest
import torch
from torch import nn

from conftest import get_json
from conftest import make_app
from conftest import read_events
from conftest import wait_for_steps
from tb_gradcheck import cli
from tb_gradcheck.core import metadata

STEPS = 4
ACT = metadata.ACTIVATION_STAT_COLUMNS


def _train(run_dir, steps, activations, model=None):
    torch.manual_seed(0)
    model = model or nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    g = torch.Generator().manual_seed(0)
    from tb_gradcheck.torch import GradientWriter

    with GradientWriter(run_dir, model, activations=activations) as writer:
        for step in steps:
            model.zero_grad()
            model(torch.randn(6, 3, generator=g)).sum().backward()
            writer.write(step)
    return model


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("acts")
    _train(root / "new", range(STEPS), True)
    _train(root / "old", range(STEPS), False)
    model = _train(root / "both", range(2), False)
    _train(root / "both", range(2, STEPS), True, model)
    return root


def test_runs_offer_activation_metrics_only_where_stored(logdir, data_path):
    client, _ = make_app(logdir, data_path)
    entries = {run: wait_for_steps(client, run, STEPS) for run in ("new", "old", "both")}
    for run in ("new", "both"):
        assert set(ACT) <= set(entries[run]["metrics"]) and entries[run]["aggregates"]["act_rms"] == ["last"]
    assert not set(ACT) & set(entries["old"]["metrics"])


def test_heatmap_serves_act_rms_as_stored_and_old_steps_stay_missing(logdir, data_path):
    client, _ = make_app(logdir, data_path)
    wait_for_steps(client, "both", STEPS)
    body = get_json(client, "/data/plugin/gradients/heatmap?run=new&metric=act_rms")
    stored = np.array([a[0, :2, -len(ACT)] for _, a, _ in read_events(logdir / "new")])
    assert body["layers"] == ["0", "2"] and body["steps"] == list(range(STEPS))
    np.testing.assert_array_equal(np.array(body["values"], np.float32), stored)
    both = get_json(client, "/data/plugin/gradients/heatmap?run=both&metric=act_rms")
    assert both["steps"] == list(range(STEPS))
    assert all(v is None for row in both["values"][:2] for v in row)  # written before activations were on
    assert all(v is not None and v > 0 for row in both["values"][2:] for v in row)


def test_old_log_reads_the_same_as_before(logdir, data_path):
    # The gradient columns of a log without activation columns come back exactly as stored.
    client, _ = make_app(logdir, data_path)
    wait_for_steps(client, "old", STEPS)
    body = get_json(client, "/data/plugin/gradients/heatmap?run=old&metric=grad_norm")
    stored = np.array([a[0, :2, 0] for _, a, _ in read_events(logdir / "old")])
    np.testing.assert_array_equal(np.array(body["values"], np.float32), stored)
    new = get_json(client, "/data/plugin/gradients/heatmap?run=new&metric=grad_norm")
    assert new["values"] == body["values"]  # same model, same data: activations change no gradient statistic


def test_export_writes_act_rms_like_any_metric(logdir, capsys):
    assert cli.main(["export", str(logdir), "--run", "new", "--metric", "act_rms"]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert table[0] == ["step", "0", "2"] and len(table) == STEPS + 1
    stored = [a[0, :2, -len(ACT)] for _, a, _ in read_events(logdir / "new")]
    for row, want in zip(table[1:], stored):
        np.testing.assert_array_equal(np.array(row[1:], np.float32), want)


def test_compare_and_layer_only(logdir, data_path):
    client, _ = make_app(logdir, data_path)
    entry = wait_for_steps(client, "both", STEPS)
    assert "act_rms" in entry["granularities"]["layer"]["metrics"]
    assert not set(ACT) & set(entry["granularities"]["variable"]["metrics"])  # an output is a module's
    get_json(client, "/data/plugin/gradients/heatmap?run=new&metric=act_rms&granularity=variable", status=404)
    body = get_json(client, "/data/plugin/gradients/compare?run=new&other=both&metric=act_rms")
    # run / other where both recorded (steps 2, 3); before that "both" has no activation values.
    assert body["steps"] == list(range(STEPS))
    assert all(v is None for row in body["values"][:2] for v in row)
    new = np.array([a[0, :2, -len(ACT)] for _, a, _ in read_events(logdir / "new")], np.float64)
    both = {
        s: a[0, :2, -len(ACT)]
        for s, a, _ in read_events(logdir / "both")
        if a.shape[-1] == len(metadata.stored_columns(1)) + len(ACT)
    }
    want = new[2:] / np.array([both[2], both[3]], np.float64)
    np.testing.assert_allclose(np.array(body["values"][2:], np.float64), want, rtol=1e-6)
