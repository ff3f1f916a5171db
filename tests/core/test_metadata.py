"""Metadata content: round trip, fingerprints, and refusal of what this version cannot read."""

import json
import subprocess
import sys

import pytest

from tb_gradcheck.core import metadata
from tb_gradcheck.core import tags


def stats_layout(rows=("a", "b")):
    variables = [f"{r}/kernel" for r in rows]
    return metadata.stats_layout(
        {"rows": rows, "sizes": [3] * len(rows)},
        {"rows": variables, "sizes": [3] * len(rows), "sparse_rows": variables[:1]},
        aggregates=("last",),
        window=1,
    )


def test_round_trip_shape_and_row_slices():
    content = stats_layout()
    parsed = metadata.parse(metadata.encode(content))
    assert parsed == content
    assert metadata.shape_of(parsed) == (1, 2 + 2 + 1, len(metadata.stored_columns(1)))
    assert metadata.rows_of(parsed, "layer") == (["a", "b"], slice(0, 2))
    assert metadata.rows_of(parsed, "variable") == (["a/kernel", "b/kernel"], slice(2, 4))
    assert metadata.header_row(parsed) == 4
    check = metadata.check_layout("variable", ["a/kernel"])
    assert metadata.shape_of(metadata.parse(metadata.encode(check))) == (1, len(metadata.CHECK_COLUMNS))


def test_tag_fingerprint_follows_the_layout():
    assert tags.tag_for(stats_layout()) == tags.tag_for(stats_layout())
    assert tags.tag_for(stats_layout()) != tags.tag_for(stats_layout(("a", "c")))
    assert tags.tag_for(stats_layout()).startswith("gradients/stats/")
    assert tags.tag_for(metadata.check_layout("layer", ["a"])).startswith("gradients/check/layer/")


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"{}", "no integer version"),
        (json.dumps({"version": 99, "kind": "stats"}).encode(), "newer tb_gradcheck"),
        (json.dumps({"version": 1, "kind": "histogram"}).encode(), "unknown kind"),
        (
            json.dumps({"version": 1, "kind": "check", "granularity": "neuron", "columns": ["x"]}).encode(),
            "unknown granularity",
        ),
        (
            json.dumps({"version": 1, "kind": "check", "granularity": "layer", "columns": ["x"], "rows": []}).encode(),
            "rows must be",
        ),
        (
            json.dumps(
                {"version": 1, "kind": "check", "granularity": "layer", "rows": ["a", "a"], "columns": ["x"]}
            ).encode(),
            "duplicates",
        ),
        (
            json.dumps(
                {"version": 1, "kind": "stats", "columns": ["x"], "aggregates": ["median"], "window": 1}
            ).encode(),
            "unknown aggregates",
        ),
        (
            json.dumps({"version": 1, "kind": "stats", "columns": ["x"], "aggregates": ["last"], "window": 0}).encode(),
            "window must be",
        ),
        (
            json.dumps({"version": 1, "kind": "stats", "columns": ["x"], "aggregates": ["last"], "window": 1}).encode(),
            "no 'layer' block",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "kind": "stats",
                    "columns": ["x"],
                    "aggregates": ["last"],
                    "window": 1,
                    "layer": {"rows": ["a"], "sizes": [1, 2]},
                }
            ).encode(),
            "one integer per row",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "kind": "stats",
                    "columns": ["x"],
                    "aggregates": ["last"],
                    "window": 1,
                    "layer": {"rows": ["a"], "sizes": [1], "sparse_rows": ["z"]},
                }
            ).encode(),
            "sparse_rows",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "kind": "stats",
                    "columns": ["x"],
                    "aggregates": ["last"],
                    "window": 1,
                    "layer": {"rows": ["a"], "sizes": [1], "outside_optimizer": ["z"]},
                }
            ).encode(),
            "outside_optimizer",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "kind": "stats",
                    "columns": ["x"],
                    "aggregates": ["last"],
                    "window": 1,
                    "gradients_not_cleared": "yes",
                    "layer": {"rows": ["a"], "sizes": [1]},
                    "variable": {"rows": ["a"], "sizes": [1]},
                }
            ).encode(),
            "gradients_not_cleared is true where stored, got 'yes'",
        ),
    ],
)
def test_parse_refuses_bad_content_with_the_reason(raw, reason):
    with pytest.raises(metadata.ContentError, match=reason):
        metadata.parse(raw)


def test_plugin_entry_module_imports_no_tensorflow():
    code = "import sys, tb_gradcheck.reader.plugin; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_activation_columns_follow_the_optimizer_columns_and_parse():
    content = metadata.stats_layout(
        {"rows": ["a"], "sizes": [3]},
        {"rows": ["a/w"], "sizes": [3]},
        aggregates=("last",),
        window=1,
        optimizer_columns=("act_rms", "update_norm", "act_dead_fraction"),
    )
    assert content["columns"][-3:] == ["update_norm", "act_rms", "act_dead_fraction"]
    assert metadata.parse(metadata.encode(content)) == content
    # A layout of only activation columns (and ones this version does not know) is readable too.
    content["columns"] = ["act_rms", "act_from_the_future"]
    assert metadata.parse(metadata.encode(content))["columns"] == ["act_rms", "act_from_the_future"]


def test_activation_values_from_sums_with_missing_where_undefined():
    import numpy as np

    from tb_gradcheck.core import rowstats
    from tb_gradcheck.core import structure

    s = structure.Structure(["a/w", "b/w", "c/w"], ["a", "b", "c"], [(4, 2), (4, 4), (1, 4)], [4, 4, 1])
    sums = np.zeros((3, len(rowstats.ACTIVATION_SUMS)))
    col = {n: k for k, n in enumerate(rowstats.ACTIVATION_SUMS)}
    sums[0, [col["squares"], col["elements"], col["max_abs"], col["dead_units"], col["units"]]] = [8, 2, 3, 1, 4]
    sums[1, [col["squares"], col["elements"], col["max_abs"], col["nonfinite"]]] = [np.inf, 4, np.nan, 2]
    sums[1, [col["saturated"], col["squashed"]]] = [1, 4]
    values = rowstats.activation_values(s, sums)  # row c did not run: elements 0
    layer = {k: v[0].tolist() for k, v in values.items()}
    assert layer["act_rms"] == [2.0, float("inf"), -1.0]
    assert layer["act_max_abs"][0] == 3.0 and np.isnan(layer["act_max_abs"][1]) and layer["act_max_abs"][2] == -1
    assert layer["act_nonfinite"] == [0.0, 2.0, -1.0]
    assert layer["act_dead_fraction"] == [0.25, -1.0, -1.0]
    assert layer["act_saturated_fraction"] == [-1.0, 0.25, -1.0]
    assert all((v[1] == -1).all() for v in values.values())


def test_a_layout_marked_not_cleared_parses_and_an_unmarked_one_keeps_its_bytes():
    blocks = ({"rows": ["a"], "sizes": [3]}, {"rows": ["a/w"], "sizes": [3]})
    plain = metadata.stats_layout(*blocks, aggregates=("last",), window=1)
    marked = metadata.stats_layout(*blocks, aggregates=("last",), window=1, not_cleared=True)
    assert "gradients_not_cleared" not in plain and marked["gradients_not_cleared"] is True
    assert metadata.parse(metadata.encode(marked)) == marked
    assert metadata.encode(metadata.stats_layout(*blocks, aggregates=("last",), window=1, not_cleared=False)) == (
        metadata.encode(plain)
    )
