"""Metadata content: round trip, fingerprints, and refusal of what this version cannot read."""

import json
import subprocess
import sys

import pytest

from tb_gradcheck import metadata


def stats_layout(rows=("a", "b")):
    return metadata.layout(metadata.KIND_STATS, "layer", rows=rows, columns=metadata.STAT_COLUMNS,
                           aggregates=("last",), window=1, sizes=[3] * len(rows))


def test_round_trip_and_shape():
    content = stats_layout()
    parsed = metadata.parse(metadata.encode(content))
    assert parsed == content
    assert metadata.shape_of(parsed) == (1, 2, len(metadata.STAT_COLUMNS))


def test_tag_fingerprint_follows_the_layout():
    assert metadata.tag_for(stats_layout()) == metadata.tag_for(stats_layout())
    assert metadata.tag_for(stats_layout()) != metadata.tag_for(stats_layout(("a", "c")))
    assert metadata.tag_for(stats_layout()).startswith("gradients/stats/layer/")


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"{}", "no integer version"),
        (json.dumps({"version": 99, "kind": "stats"}).encode(), "newer tb_gradcheck"),
        (json.dumps({"version": 1, "kind": "histogram"}).encode(), "unknown kind"),
        (json.dumps({"version": 1, "kind": "stats", "granularity": "neuron"}).encode(), "unknown granularity"),
        (json.dumps({"version": 1, "kind": "stats", "granularity": "layer", "rows": []}).encode(), "rows must be"),
        (json.dumps({"version": 1, "kind": "stats", "granularity": "layer", "rows": ["a", "a"],
                     "columns": ["x"]}).encode(), "duplicates"),
        (json.dumps({"version": 1, "kind": "stats", "granularity": "layer", "rows": ["a"], "columns": ["x"],
                     "aggregates": ["median"], "window": 1}).encode(), "unknown aggregates"),
        (json.dumps({"version": 1, "kind": "stats", "granularity": "layer", "rows": ["a"], "columns": ["x"],
                     "aggregates": ["last"], "window": 0}).encode(), "window must be"),
        (json.dumps({"version": 1, "kind": "stats", "granularity": "layer", "rows": ["a"], "columns": ["x"],
                     "aggregates": ["last"], "window": 1, "sizes": [1, 2]}).encode(), "one integer per row"),
    ],
)
def test_parse_refuses_bad_content_with_the_reason(raw, reason):
    with pytest.raises(metadata.ContentError, match=reason):
        metadata.parse(raw)


def test_plugin_entry_module_imports_no_tensorflow():
    code = "import sys, tb_gradcheck.plugin; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
