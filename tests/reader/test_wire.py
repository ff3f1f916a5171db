"""The heatmap wire format (tb_gradcheck/reader/wire.py) through TensorBoard's real WSGI app.

Summaries are written by TensorFlow and read by TensorBoard's Python
multiplexer; the frontend's decoder of the same bytes is tested under node
(tests/frontend/wire.test.mjs).
"""

import base64

import numpy as np
import pytest

from conftest import get_json
from conftest import make_app
from conftest import synthetic_run
from conftest import wait_for_steps
from rawlogs import stats_points
from rawlogs import write_raw

API = "/data/plugin/gradients/"
STEPS = 60


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    import tensorflow as tf
    from tensorboard.compat.proto import summary_pb2

    from tb_gradcheck.core import metadata
    from tb_gradcheck.core import tags

    logdir = tmp_path_factory.mktemp("wire")
    synthetic_run(logdir / "run", STEPS)
    # The same model under another root scope, as Keras names a second
    # model, written before layouts stored shapes: its rows' element counts
    # are net/dense's and net/dense_1's (4x3 + 3 and 3x3 + 3), then a layer
    # the run lacks.
    rows = ["other/dense", "other/dense_1", "other/extra"]
    write_raw(
        logdir / "renamed",
        stats_points(3, range(STEPS), value=2.0),
        content=metadata.stats_layout(
            {"rows": rows, "sizes": [15, 12, 7]}, {"rows": rows, "sizes": [15, 12, 7]}, ["last"], 1
        ),
    )
    # Gradient checks: row b is a mismatch at steps 20 and 30, not checked at step 0.
    rows = ["net/dense", "net/dense_1"]
    # Five columns, as written before min_detectable_error existed: readers take columns by name.
    content = {
        **metadata.check_layout("layer", rows),
        "columns": ["analytic", "numeric", "relative_error", "noise_floor", "status"],
    }
    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = metadata.PLUGIN_NAME
    md.plugin_data.content = metadata.encode(content)
    md.data_class = summary_pb2.DATA_CLASS_TENSOR
    code = {s: float(i) for i, s in enumerate(metadata.CHECK_STATUSES)}
    with tf.summary.create_file_writer(str(logdir / "run")).as_default():
        for step in (0, 10, 20, 30):
            t = np.array([[1, 1, 1e-5, 1e-6, code["ok"]], [1, 1, 2e-5, 1e-6, code["ok"]]], np.float32)
            if step >= 20:
                t[1, 2], t[1, 4] = 0.05, code["mismatch"]
            if step == 0:
                t[1, 4] = np.nan
            tf.summary.write(tags.tag_for(content), tf.constant(t), step=step, metadata=md)
    c, _ = make_app(logdir, "python")
    wait_for_steps(c, "run", STEPS)
    wait_for_steps(c, "renamed", STEPS)
    return c


def f32(text, shape):
    return np.frombuffer(base64.b64decode(text), "<f4").reshape(shape)


def test_check_status_travels_as_codes_with_the_servers_order(client):
    from tb_gradcheck.core import metadata

    body = get_json(client, API + "heatmap?run=run&metric=check_error&encoding=f32")
    assert body["status_names"] == list(metadata.CHECK_STATUSES) == ["ok", "inconclusive", "mismatch"]
    assert body["status"] is None  # no nested JSON strings in the compact encoding
    codes = f32(body["status_f32"], (4, 2))
    assert np.isnan(codes[0, 1]) and codes[0, 0] == 0
    assert codes[2:, 1].tolist() == [2, 2] and codes[1].tolist() == [0, 0]
    as_json = get_json(client, API + "heatmap?run=run&metric=check_error")
    assert as_json["status"][2] == ["ok", "mismatch"] and as_json["status"][0] == ["ok", None]
    # A bin keeps its worst status: mismatch over ok.
    binned = get_json(client, API + "heatmap?run=run&metric=check_error&encoding=f32&width=2")
    assert f32(binned["status_f32"], (2, 2)).tolist() == [[0, 0], [0, 2]]


def test_checks_written_before_float64_recheck_read_as_their_own_dtypes_verdicts(client):
    body = get_json(client, API + "checks?run=run")
    assert [c["float64_recheck"] for c in body["rows"]] == ["none", "none"]
    assert [c["status"] for c in body["rows"]] == ["ok", "mismatch"]


def test_step_and_row_windows_cut_before_binning(client):
    full = get_json(client, API + "heatmap?run=run&metric=grad_norm&granularity=variable")
    body = get_json(
        client,
        API + "heatmap?run=run&metric=grad_norm&granularity=variable&first_step=10&last_step=19&row_start=2&row_end=4",
    )
    assert body["steps"] == list(range(10, 20)) and body["num_steps"] == 10
    assert body["layers"] == full["layers"][2:4] and body["row_start"] == 2 and body["num_rows"] == 6
    assert body["values"] == [row[2:4] for row in full["values"][10:20]]
    binned = get_json(client, API + "heatmap?run=run&metric=grad_norm&first_step=10&last_step=19&width=2")
    assert binned["steps"] == [10, 15] and binned["step_ends"] == [14, 19]
    # Past the end is clamped, as slicing is; nothing inside the range is an empty matrix.
    assert get_json(client, API + "heatmap?run=run&metric=grad_norm&row_start=2&row_end=99")["layers"] == [
        "net/dense_2"
    ]
    assert get_json(client, API + "heatmap?run=run&metric=grad_norm&first_step=1000")["steps"] == []


@pytest.mark.parametrize(
    "query",
    [
        "first_step=9&last_step=3",
        "row_start=5&row_end=2",
        "first_step=-1",
        "row_end=x",
        "first_step=1&first_step=2",
        "align=diagonal",
    ],
)
def test_bad_windows_are_400_not_500(client, query):
    route = "compare?run=run&other=renamed" if "align" in query else "heatmap?run=run"
    response = client.get(API + route + "&metric=grad_norm&" + query)
    assert response.status_code == 400, (query, response.data[:200])


def test_compare_aligns_by_structure_when_asked_and_by_sizes_in_logs_without_shapes(client):
    by_name = get_json(client, API + "compare?run=run&other=renamed&metric=grad_norm")
    assert (
        by_name["alignment"] == "name"
        and by_name["matched"] == 0
        and by_name["only_in_other"]
        == [
            "other/dense",
            "other/dense_1",
            "other/extra",
        ]
    )
    body = get_json(client, API + "compare?run=run&other=renamed&metric=grad_norm&align=structure&encoding=f32")
    assert body["alignment"] == "structure" and body["basis"] == "sizes" and body["matched"] == 2
    assert body["layers"] == ["net/dense", "net/dense_1", "net/dense_2", "other/extra"]
    assert body["other_layers"] == ["other/dense", "other/dense_1", None, "other/extra"]
    assert body["run_layers"] == ["net/dense", "net/dense_1", "net/dense_2", None]
    assert body["only_in_run"] == ["net/dense_2"] and body["only_in_other"] == ["other/extra"]
    heat = get_json(client, API + "heatmap?run=run&metric=grad_norm")
    ratio = f32(body["values_f32"], (STEPS, 4))
    np.testing.assert_allclose(ratio[:, :2], np.array(heat["values"])[:, :2] / 2.0, rtol=1e-6)
    missing = np.unpackbits(np.frombuffer(base64.b64decode(body["missing_bits"]), np.uint8))[: STEPS * 4].reshape(
        STEPS, 4
    )
    assert missing[:, 2:].all() and not missing[:, :2].any()
    assert client.get(API + "compare?run=run&other=renamed&metric=check_error").status_code == 400
