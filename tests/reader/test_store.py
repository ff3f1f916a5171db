"""The read side's one cache: bounded by bytes, and the store and queries over real TensorBoard reads.

Runs are written by the real GradientWriter and read through TensorBoard's
own MultiplexerDataProvider (``store.local_store``); the closed-form values
of ``conftest.synthetic_run`` say what every answer must be.
"""

import json
import time

import numpy as np
import pytest

from conftest import next_second
from conftest import synthetic_run
from tb_gradcheck.reader import cache
from tb_gradcheck.reader import points
from tb_gradcheck.reader import queries
from tb_gradcheck.reader import store

STEPS = 40
RUNS = ("r0", "r1", "r2")


def test_cache_drops_least_recently_used_first_among_equals_and_never_exceeds_its_budget():
    c = cache.Cache(100)
    c.put("a", 1, 40)
    c.put("b", 2, 40)
    assert c.get("a") == 1  # "a" is now the most recent
    c.put("c", 3, 40)
    assert "b" not in c and c.get("a") == 1 and c.get("c") == 3 and c.nbytes == 80
    c.put("a", 4, 10)  # replacing an entry counts its new size only
    assert c.nbytes == 50 and c.get("a") == 4
    c.put("huge", 5, 101)  # larger than the whole budget: not kept, nothing evicted for it
    assert "huge" not in c and c.nbytes == 50 and len(c) == 2
    for i in range(50):
        c.put(i, i, 7)
        assert c.nbytes <= 100
    c.pop(49)
    assert 49 not in c and c.nbytes == sum(7 for k in range(50) if k in c)


def test_cache_keeps_small_entries_that_are_expensive_to_rebuild_while_large_ones_cycle():
    c = cache.Cache(1000)
    for i in range(5):
        c.put(("summary", i), i, 10, cost=300)  # a few bytes that cost a whole tag to get back
    for i in range(20):  # many large entries pass through, never touched again
        c.put(("tag", i), i, 300)
        assert c.nbytes <= 1000
    assert all(("summary", i) in c for i in range(5))
    assert [k for k in c.keys() if k[0] == "tag"] == [("tag", 17), ("tag", 18), ("tag", 19)]  # LRU among tags
    # Not immortal: each turnover of the whole budget ages them by one unit
    # of priority, and they started 30 units (cost / size) ahead.
    for i in range(100 * 40):
        c.put(("other", i), i, 10)
    assert not any(("summary", i) in c for i in range(5))


@pytest.mark.parametrize("budget", [-1, 1.5, True, "1"])
def test_cache_refuses_a_budget_that_is_not_a_byte_count(budget):
    with pytest.raises(ValueError, match="Expected max_bytes"):
        cache.Cache(budget)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("runs")
    for run in RUNS:
        sizes, scale = synthetic_run(logdir / run, STEPS)
    return logdir, sizes, scale


def tag_bytes(st, ctx, eid, run):
    """Bytes of one run's decoded stats tag, as the store sizes it."""
    index = st.run(ctx, eid, run)
    (part,), _ = st.parts(ctx, eid, index, "stats", "layer")
    return part.values.nbytes + part.steps.nbytes


def check_norms(heat, sizes, scale):
    want = [[np.sqrt(sizes[j]) * scale(j, s) for j in range(3)] for s in range(STEPS)]
    np.testing.assert_allclose(heat.values, want, rtol=1e-6)  # float32 storage


def test_cache_stays_within_budget_and_answers_stay_exact_while_it_evicts(logdir):
    logdir, sizes, scale = logdir
    probe, ctx, eid = store.local_store(logdir)
    one_run = tag_bytes(probe, ctx, eid, "r0")
    # Room for one run's values and the small entries, not for two runs' values.
    budget = one_run + one_run // 2
    st, ctx, eid = store.local_store(logdir, cache_bytes=budget)
    for run in RUNS + RUNS:
        check_norms(queries.heatmap(st, ctx, eid, run, "grad_norm"), sizes, scale)
        assert st.cache.nbytes <= budget
    # What the tab looked at last is held: its heatmap (one metric, small
    # for the whole tag it costs to rebuild), or the tag values themselves.
    held = [k for k in st.cache.keys() if k[0] in ("tag", "heatmap")]
    assert held and ("heatmap", eid, "r2") in {k[:3] for k in held}
    assert sum(k[0] == "tag" for k in st.cache.keys()) <= 1


def test_runs_listing_keeps_only_summaries_when_values_do_not_fit(logdir):
    logdir, _, _ = logdir
    probe, ctx, eid = store.local_store(logdir)
    budget = tag_bytes(probe, ctx, eid, "r0") // 2  # not even one run's values fit
    st, ctx, eid = store.local_store(logdir, cache_bytes=budget)
    listing = queries.runs(st, ctx, eid)
    assert [e["run"] for e in listing] == list(RUNS)
    for entry in listing:
        layer = entry["granularities"]["layer"]
        assert (layer["num_steps"], layer["first_step"], layer["last_step"]) == (STEPS, 0, STEPS - 1)
        assert entry["total_steps"] == STEPS and entry["sampled"] is False
    kinds = {k[0] for k in st.cache.keys()}
    assert "tag" not in kinds and "summary" in kinds
    assert st.cache.nbytes <= budget
    # A second listing reads nothing again: every summary is still cached.
    assert queries.runs(st, ctx, eid) == listing


class CountingProvider:
    """TensorBoard's real data provider, recording which runs each call asked for."""

    def __init__(self, provider):
        self.provider = provider
        self.listed = []
        self.read = []

    def list_tensors(self, ctx, *, experiment_id, plugin_name, run_tag_filter=None):
        self.listed.append(None if run_tag_filter is None else run_tag_filter.runs)
        return self.provider.list_tensors(
            ctx, experiment_id=experiment_id, plugin_name=plugin_name, run_tag_filter=run_tag_filter
        )

    def read_tensors(self, ctx, **kwargs):
        self.read.append(kwargs["run_tag_filter"].runs)
        return self.provider.read_tensors(ctx, **kwargs)


def test_a_heatmap_lists_only_its_own_run(logdir):
    logdir, sizes, scale = logdir
    st, ctx, eid = store.local_store(logdir)
    counting = CountingProvider(st._provider)
    st = store.Store(counting)
    check_norms(queries.heatmap(st, ctx, eid, "r1", "grad_norm"), sizes, scale)
    assert counting.listed == [frozenset({"r1"})]
    with pytest.raises(queries.NotFound, match="no gradient data for run 'nope'"):
        queries.heatmap(st, ctx, eid, "nope", "grad_norm")


def test_a_repeated_listing_reads_no_tag_again_when_only_some_values_fit(logdir):
    logdir, _, _ = logdir
    probe, ctx, eid = store.local_store(logdir)
    one_run = tag_bytes(probe, ctx, eid, "r0")
    counting = CountingProvider(probe._provider)
    st = store.Store(counting, cache_bytes=2 * one_run + one_run // 2, listing_ttl=0)  # two runs' values fit
    first = queries.runs(st, ctx, eid)
    assert sorted(counting.read) == [frozenset({run}) for run in RUNS]
    assert queries.runs(st, ctx, eid) == first
    assert len(counting.read) == len(RUNS)  # the summaries outlived the values evicted to make room
    assert sum(k[0] == "tag" for k in st.cache.keys()) <= 2


def test_findings_and_heatmaps_are_kept_until_the_run_changes(tmp_path):
    """The tab asks again at every refresh; unchanged data must not cost reading its tags again."""
    from tb_gradcheck.findings import diagnose

    synthetic_run(tmp_path / "r", 20)
    probe, ctx, eid = store.local_store(tmp_path)
    counting = CountingProvider(probe._provider)
    # The tag's values never fit, so any recompute reads the tag again.
    st = store.Store(counting, cache_bytes=tag_bytes(probe, ctx, eid, "r") - 1, listing_ttl=0)
    first = queries.findings(st, ctx, eid, "r")
    reads = len(counting.read)
    assert reads and queries.findings(st, ctx, eid, "r") == first and len(counting.read) == reads
    heat = queries.heatmap(st, ctx, eid, "r", "grad_norm")
    reads = len(counting.read)
    again = queries.heatmap(st, ctx, eid, "r", "grad_norm")
    assert again is heat and len(counting.read) == reads and not again.values.flags.writeable
    strict = diagnose.Thresholds(rise_orders=0.01)
    queries.findings(st, ctx, eid, "r", strict)  # other thresholds are another answer
    assert len(counting.read) > reads
    reads = len(counting.read)
    next_second()
    synthetic_run(tmp_path / "r", 25)  # a restart that goes 5 steps further: the tag's version changes
    probe._provider._multiplexer.Reload()
    queries.findings(st, ctx, eid, "r")
    assert len(counting.read) > reads
    assert queries.heatmap(st, ctx, eid, "r", "grad_norm").steps[-1] == 24


def _write_wide(run_dir, rows, steps):
    """``steps`` points of a ``rows``-layer stats layout whose grad_norm is ``step + 1``; returns the layout."""
    import tensorflow as tf

    from tb_gradcheck.core import tags
    from tests.rawlogs import md_bytes
    from tests.rawlogs import stats_content

    content = stats_content([f"net/block_{i:05d}" for i in range(rows)])
    tag = tags.tag_for(content)
    arr = np.zeros((1, 2 * rows + 1, len(content["columns"])), np.float32)
    norm = content["columns"].index("grad_norm")
    writer = tf.summary.create_file_writer(str(run_dir), max_queue=100)
    with writer.as_default():
        for step in range(steps):
            arr[0, :-1, norm] = step + 1
            arr[0, -1, 0] = step + 1  # the write counter
            tf.summary.write(tag, arr, step=step, metadata=md_bytes(content) if step == 0 else md_bytes(b""))
    writer.close()
    return content


def _check_capped(client, limit, steps):
    from conftest import get_json

    entry = next(e for e in get_json(client, "/data/plugin/gradients/runs")["runs"] if e["run"] == "wide")
    assert entry["capped"] and entry["sampled"] and entry["total_steps"] == steps
    assert entry["granularities"]["layer"]["num_steps"] == limit
    (problem,) = entry["problems"]
    assert "256 MiB" in problem["reason"] and f"at most {limit:,} points" in problem["reason"]
    body = get_json(client, "/data/plugin/gradients/export?run=wide&metric=grad_norm&format=json")
    kept = np.array(body["steps"])
    assert len(kept) == limit and len(set(kept)) == limit and kept.max() == steps - 1  # the last step is kept
    values = np.array(body["values"], np.float64)
    np.testing.assert_array_equal(values, np.repeat(kept[:, None] + 1.0, values.shape[1], axis=1))


def test_a_layout_larger_than_one_data_server_read_is_sampled_not_a_failed_listing(tmp_path):
    """The Rust data server's answers are capped at 256 MiB; a larger tag made every runs listing a 500."""
    from conftest import make_app

    rows, steps = 8_000, 720  # 375 KiB per point, 264 MiB in all
    content = _write_wide(tmp_path / "wide", rows, steps)
    limit = points.read_limit(content)
    assert limit < steps
    client, _ = make_app(tmp_path, "rust")
    deadline = time.time() + 120
    while time.time() < deadline:  # the data server loads in the background
        listed = client.get("/data/plugin/gradients/runs")
        assert listed.status_code == 200, listed.data[:300]
        if json.loads(listed.data)["runs"] and json.loads(listed.data)["runs"][0]["total_steps"] == steps:
            break
        time.sleep(0.5)
    _check_capped(client, limit, steps)


def test_the_python_data_path_reads_within_the_same_budget(tmp_path, monkeypatch):
    from conftest import make_app
    from tb_gradcheck.core import metadata

    rows, steps = 10, 30
    point = 4 * (2 * rows + 1) * len(metadata.stored_columns(1))
    monkeypatch.setattr(points, "READ_BUDGET_BYTES", 12 * point)
    content = _write_wide(tmp_path / "wide", rows, steps)
    assert points.read_limit(content) == 12
    client, _ = make_app(tmp_path, "python")
    _check_capped(client, 12, steps)


def test_findings_of_a_run_larger_than_half_the_cache_leave_the_heatmap_kept(logdir):
    """Values that cannot all stay would only push out the heatmap's blocks: they are read, not kept."""
    logdir, sizes, scale = logdir
    probe, ctx, eid = store.local_store(logdir)
    index = probe.run(ctx, eid, "r0")
    budget = index.read_bytes() + index.read_bytes() // 2  # the values fit once, not twice
    st, ctx, eid = store.local_store(logdir, cache_bytes=budget)
    heat = queries.heatmap(st, ctx, eid, "r0", "grad_norm")
    held = [k for k in st.cache.keys() if k[0] != "listing"]
    assert queries.findings(st, ctx, eid, "r0") == queries.findings(probe, ctx, eid, "r0")
    assert not [k for k in st.cache.keys() if k[0] == "tag"]
    assert set(held) <= set(st.cache.keys())  # the blocks and the heatmap are still there
    assert queries.heatmap(st, ctx, eid, "r0", "grad_norm") is heat
    small = store.local_store(logdir)[0]  # the default budget keeps a small run's values
    queries.findings(small, ctx, eid, "r0")
    assert [k for k in small.cache.keys() if k[0] == "tag"]
