"""Corrupted logs: every unreadable tag is reported with its reason, every other run keeps working, nothing 500s.

Each damaged run is written by TensorFlow's own summary ops with a hand-made
metadata or tensor (tests/rawlogs.py), or damaged on disk after a real
GradientWriter wrote it, and read by TensorBoard's real data paths.
"""

import os
import struct

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2

from conftest import get_json
from conftest import make_app
from conftest import wait_for_steps
from rawlogs import C
from rawlogs import event_files
from rawlogs import good_run
from rawlogs import stats_content
from rawlogs import stats_points
from rawlogs import write_raw
from tb_gradcheck.core import metadata

R = ["m/a", "m/b"]
STEPS = range(3)
BASE = "/data/plugin/gradients/"
# A check layout as tb_gradcheck wrote it before min_detectable_error: readers take columns by name.
CHECK = {
    **metadata.check_layout("layer", R),
    "columns": ["analytic", "numeric", "relative_error", "noise_floor", "status"],
}
SHAPE = (1, 2 + 2 + 1, C)  # one slab; two layers, two variables and the header row; the stored columns


def with_block(granularity, **fields):
    content = stats_content(R)
    content[granularity] = dict(content[granularity], **fields)
    return content


# run -> (how it is written, a fragment of the reason GET runs must give).
CASES = {
    "rows_do_not_match_layout": (
        lambda d: write_raw(d, stats_points(3, STEPS), content=stats_content(R)),
        f"3 of 3 points have shape (1, 7, {C}) float32; expected shape {SHAPE} float32",
    ),
    "scalar_stats": (
        lambda d: write_raw(d, [(s, np.float32(1.0)) for s in STEPS], content=stats_content(R)),
        f"shape () float32; expected shape {SHAPE} float32",
    ),
    "float64_stats": (
        lambda d: write_raw(d, [(s, np.ones(SHAPE)) for s in STEPS], content=stats_content(R)),
        f"shape {SHAPE} float64",
    ),
    "string_stats": (
        lambda d: write_raw(d, [(s, np.full(SHAPE, b"x", object)) for s in STEPS], content=stats_content(R)),
        f"shape {SHAPE} string",
    ),
    "future_version": (
        lambda d: write_raw(d, stats_points(2, STEPS), content=dict(stats_content(R), version=99)),
        "written by a newer tb_gradcheck (content version 99",
    ),
    "garbage_content": (
        lambda d: write_raw(d, stats_points(2, STEPS), tag="gradients/stats/x", content=b"\xff\xfe\x00\x81junk"),
        "metadata content is not UTF-8 JSON",
    ),
    "empty_content": (
        lambda d: write_raw(d, stats_points(2, STEPS), tag="gradients/stats/x", content=b""),
        "metadata content is not UTF-8 JSON",
    ),
    "json_not_an_object": (
        lambda d: write_raw(d, stats_points(2, STEPS), tag="gradients/stats/x", content=b"[1, 2]"),
        "not a JSON object: list",
    ),
    "json_nested_deeply": (
        lambda d: write_raw(d, stats_points(2, STEPS), tag="gradients/stats/x", content=b"[" * 100_000),
        "nested too deeply",
    ),
    "layer_block_not_an_object": (
        lambda d: write_raw(d, stats_points(2, STEPS), content=dict(stats_content(R), layer="m/a")),
        "stats content has no 'layer' block",
    ),
    "sparse_rows_not_names": (
        lambda d: write_raw(d, stats_points(2, STEPS), content=with_block("layer", sparse_rows=[["m/a"]])),
        "layer sparse_rows must be a list of row names",
    ),
    "no_known_column": (
        lambda d: write_raw(d, stats_points(2, STEPS), content=dict(stats_content(R), columns=list("uvwxy"))),
        "include none of ['grad_norm'",
    ),
    "check_without_status": (
        lambda d: write_raw(
            d, [(s, np.ones((2, 1), np.float32)) for s in STEPS], content=dict(CHECK, columns=["analytic"])
        ),
        "needs a 'status' column",
    ),
    "check_status_out_of_range": (
        lambda d: write_raw(
            d, [(s, np.array([[1, 1, 0.1, 1e-3, 7], [1, 1, 0.1, 1e-3, 0]], np.float32)) for s in STEPS], content=CHECK
        ),
        "3 of 3 points have an unknown check status code",
    ),
    "nan_write_counter": (
        lambda d: write_raw(d, stats_points(2, STEPS, count=np.nan), content=stats_content(R)),
        "the write counter at step 2 is nan, not a count of at least 1",
    ),
    "negative_write_counter": (
        lambda d: write_raw(d, stats_points(2, STEPS, count=-5), content=stats_content(R)),
        "the write counter at step 2 is -5.0",
    ),
    "fractional_write_counter": (
        lambda d: write_raw(d, stats_points(2, STEPS, count=2.5), content=stats_content(R)),
        "the write counter at step 2 is 2.5",
    ),
    "some_points_bad": (
        lambda d: write_raw(
            d, [stats_points(2, [0])[0], stats_points(3, [1])[0], stats_points(2, [2])[0]], content=stats_content(R)
        ),
        f"1 of 3 points have shape (1, 7, {C}) float32",
    ),
}


@pytest.fixture(scope="module")
def apps():
    """One app per (logdir, data path) for the whole module: a Rust data server takes seconds to start."""
    cache = {}

    def app(logdir, data_path):
        if (logdir, data_path) not in cache:
            cache[logdir, data_path] = make_app(logdir, data_path)[0]
        return cache[logdir, data_path]

    return app


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corrupt")
    good_run(root / "good", steps=5)
    for run, (write, _) in CASES.items():
        write(root / run)
    # Stored oddly but readable: must be served, with no problem.
    write_raw(
        root / "only_mean_aggregate", stats_points(2, STEPS, value=2.0), content=stats_content(R, aggregates=["mean"])
    )
    reordered = dict(CHECK, columns=["status", "relative_error", "analytic", "numeric"])
    write_raw(
        root / "check_columns_reordered",
        [(s, np.array([[2, 0.5, 1, 1], [np.nan, 0, 0, 0]], np.float32)) for s in STEPS],
        content=reordered,
    )
    write_raw(root / "all_nan", stats_points(2, range(30), value=np.nan), content=stats_content(R))
    return root


def routes_for(entry):
    """The routes and parameters the tab or a user would send for one entry of GET runs, and near misses."""
    run = entry["run"]
    urls = [f"findings?run={run}"]
    for metric in entry["metrics"][:1] + ["check_error", "grad_norm"]:
        for granularity in ("layer", "variable"):
            for aggregate in entry["aggregates"].get(metric, [])[:1] + ["max"]:
                q = f"run={run}&metric={metric}&granularity={granularity}&aggregate={aggregate}"
                urls += [f"heatmap?{q}&width=2", f"export?{q}&format=json", f"compare?{q}&other=good"]
    return urls


def test_every_corruption_is_reported_with_its_reason_and_nothing_500s(logdir, data_path, apps):
    client = apps(logdir, data_path)
    wait_for_steps(client, "good", 5)
    wait_for_steps(client, "all_nan", 30)  # the Rust server loads runs one by one
    entries = {e["run"]: e for e in get_json(client, BASE + "runs")["runs"]}
    for run, (_, reason) in CASES.items():
        assert run in entries, (run, sorted(entries))
        reasons = [p["reason"] for p in entries[run]["problems"]]
        assert any(reason in r for r in reasons), (run, reasons)
        assert all(p["tag"].startswith("gradients/") for p in entries[run]["problems"])
        assert len({(p["tag"], p["reason"]) for p in entries[run]["problems"]}) == len(reasons), reasons  # once each
    for run in ("good", "only_mean_aggregate", "check_columns_reordered", "all_nan"):
        assert entries[run]["problems"] == [], (run, entries[run]["problems"])

    statuses = {}
    for entry in entries.values():
        for url in routes_for(entry):
            response = client.get(BASE + url)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code in (200, 400, 404), (url, response.status_code, response.data[:300])
    assert statuses[200] > 50 and statuses[404] > 50, statuses  # the sweep reached real data and real misses


def test_the_healthy_run_beside_corrupted_ones_is_served_exactly(logdir, data_path, apps):
    client = apps(logdir, data_path)
    entry = wait_for_steps(client, "good", 5)
    assert entry["total_steps"] == 5 and entry["sampled"] is False
    body = get_json(client, BASE + "heatmap?run=good&metric=grad_norm")
    assert body["layers"] == ["good/a", "good/b"]
    assert body["values"] == [[float(s + 1)] * 2 for s in range(5)]


def test_readable_points_of_a_partly_bad_tag_are_served(logdir, data_path, apps):
    client = apps(logdir, data_path)
    wait_for_steps(client, "some_points_bad", 2)
    body = get_json(client, BASE + "heatmap?run=some_points_bad&metric=grad_norm")
    assert body["steps"] == [0, 2] and body["values"] == [[1.0, 1.0], [1.0, 1.0]]
    # The NaN progress counter is ignored, not read as a number of steps.
    # A write counter that is not a count is ignored, not read as a number of steps.
    for run in ("nan_write_counter", "negative_write_counter", "fractional_write_counter"):
        entry = wait_for_steps(client, run, 3)
        assert entry["total_steps"] is None and entry["sampled"] is False, entry
        assert get_json(client, BASE + f"heatmap?run={run}&metric=grad_norm")["values"] == [[1.0, 1.0]] * 3


def test_odd_but_valid_layouts_are_read_by_column_and_aggregate_name(logdir, data_path, apps):
    client = apps(logdir, data_path)
    entry = wait_for_steps(client, "only_mean_aggregate", 3)
    assert entry["aggregates"]["grad_norm"] == ["mean"]
    body = get_json(client, BASE + "heatmap?run=only_mean_aggregate&metric=grad_norm&aggregate=mean")
    assert body["values"] == [[2.0, 2.0]] * 3
    assert get_json(client, BASE + "findings?run=only_mean_aggregate")["findings"] == []
    wait_for_steps(client, "check_columns_reordered", 3)
    check = get_json(client, BASE + "heatmap?run=check_columns_reordered&metric=check_error")
    assert check["status"] == [["mismatch", None]] * 3 and check["values"] == [[0.5, None]] * 3
    findings = get_json(client, BASE + "findings?run=check_columns_reordered")["findings"]
    assert [(f["kind"], f["layers"]) for f in findings] == [("check_failure", ["m/a"])]
    wait_for_steps(client, "all_nan", 30)
    nan = get_json(client, BASE + "findings?run=all_nan")["findings"]
    assert [(f["kind"], f["layers"]) for f in nan] == [("non_finite", R)]
    heat = get_json(client, BASE + "heatmap?run=all_nan&metric=grad_norm&width=7")
    assert {v for row in heat["values"] for v in row} == {"NaN"}


# -- damaged event files ----------------------------------------------------


def records(path):
    """``[(offset, length, Event)]`` of a TFRecord file, parsed by hand (not by TensorBoard)."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[pos : pos + 8])
        size = 12 + n + 4
        if pos + size > len(data):
            break
        out.append((pos, size, event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])))
        pos += size
    return out


def stats_steps(events):
    return sorted({e.step for _, _, e in events for v in e.summary.value if v.tag.startswith("gradients/stats/")})


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    good_run(root / "pristine", steps=20)
    expect = {}
    for run in ("cut_mid_record", "garbage_mid_file", "garbage_appended"):
        good_run(root / run, steps=20)
    # A writer killed mid-write leaves half a record: cut record k in half.
    path = event_files(root / "cut_mid_record")[0]
    recs = records(path)
    k = len(recs) * 2 // 3
    with open(path, "r+b") as f:
        f.truncate(recs[k][0] + recs[k][1] // 2)
    expect["cut_mid_record"] = stats_steps(recs[:k])
    # Disk damage: bytes overwritten in the middle of a record.
    path = event_files(root / "garbage_mid_file")[0]
    recs = records(path)
    k = len(recs) // 2
    data = bytearray(open(path, "rb").read())
    data[recs[k][0] + 14 : recs[k][0] + 30] = b"\xde\xad\xbe\xef" * 4
    open(path, "wb").write(bytes(data))
    expect["garbage_mid_file"] = stats_steps(recs[:k])
    with open(event_files(root / "garbage_appended")[0], "ab") as f:
        f.write(os.urandom(300))
    expect["garbage_appended"] = list(range(20))
    (root / "empty_file").mkdir()
    (root / "empty_file" / "events.out.tfevents.1.empty").write_bytes(b"")
    (root / "random_file").mkdir()
    (root / "random_file" / "events.out.tfevents.1.random").write_bytes(os.urandom(4000))
    return root, expect


def test_damaged_event_files_serve_every_intact_record_before_the_damage(damaged, data_path, apps):
    root, expect = damaged
    client = apps(root, data_path)
    wait_for_steps(client, "pristine", 20)
    for run, before in expect.items():
        assert 5 <= len(before) <= 20, (run, before)  # the damage is really mid-file
        entry = wait_for_steps(client, run, len(before))
        body = get_json(client, BASE + f"heatmap?run={run}&metric=grad_norm")
        # Everything before the damage, exactly; after it TensorBoard's Python
        # path stops reading the file, while the Rust server may resume.
        assert body["steps"][: len(before)] == before, (run, body["steps"])
        assert set(body["steps"]) <= set(range(20))
        for step, row in zip(body["steps"], body["values"]):
            assert row == [float(step + 1)] * 2, (run, step, row)
        assert get_json(client, BASE + f"findings?run={run}")["run"] == run
        assert entry["problems"] == []
    runs = [e["run"] for e in get_json(client, BASE + "runs")["runs"]]
    assert "empty_file" not in runs and "random_file" not in runs
    assert get_json(client, BASE + "heatmap?run=pristine&metric=grad_norm")["steps"] == list(range(20))
