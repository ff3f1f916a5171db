"""Load: 16 concurrent clients x 100 requests against a live `tensorboard` serving a 200-layer x 2,000-step run.

Zero errors, and every path's body identical across all its requests (the
data does not change, so a difference would be a race in the plugin's
caches). p50 and p99 are printed, not asserted: timing targets belong to
benchmarks (benchmarks/load.py builds its rows from the same functions).
"""

import numpy as np
import pytest

from benchmarks import load

LAYERS, STEPS = 200, 2000
CLIENTS, REQUESTS = 16, 100


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("load")
    load.write_large_run(logdir, LAYERS, STEPS)
    proc, url = load.start_tensorboard(logdir, wait_steps=STEPS)
    yield url
    proc.terminate()
    proc.wait(30)


def test_sixteen_clients_get_no_errors_and_the_same_answers(served):
    # A narrow canvas and no CSV download: the same routes, a third of the CPU, so
    # the test stays around a minute on two shared cores (benchmarks/load.py runs the full mix).
    mix = load.request_mix(width=400, downloads=False)
    alone = load.measure(served, mix, clients=1, requests_per_client=20, seed=1)
    loaded = load.measure(served, mix, clients=CLIENTS, requests_per_client=REQUESTS)
    rows = {r["name"].split(": ")[1]: r for r in load.rows(loaded, alone, CLIENTS)}
    print(
        f"\nload: {loaded['requests']} requests from {CLIENTS} clients in {loaded['wall_s']:.1f} s, "
        f"statuses {dict(loaded['statuses'])}; "
        f"p50 {rows['p50 latency']['value']:.0f} ms (one client alone: {rows['p50 latency']['baseline']:.0f} ms), "
        f"p99 {rows['p99 latency']['value']:.0f} ms (alone: {rows['p99 latency']['baseline']:.0f} ms), "
        f"{rows['throughput']['value']:.1f} requests/s"
    )
    assert loaded["requests"] == CLIENTS * REQUESTS
    assert loaded["errors"] == [] and alone["errors"] == [], loaded["errors"][:10]
    assert rows["errors (non-200 or dropped)"]["value"] == 0 and rows["errors (non-200 or dropped)"]["met"] is True
    # Every path of the mix was exercised, each with one body whatever the concurrency.
    assert set(loaded["digests"]) == {path for _, path in mix}
    for path, digests in loaded["digests"].items():
        assert digests == alone["digests"].get(path, digests) and len(digests) == 1, path


def test_the_served_values_are_the_written_ones(served):
    import json

    status, body = load._fetch(served + load.BASE + "heatmap?run=large&metric=grad_max_abs&width=4000", 60)
    assert status == 200
    heat = json.loads(body)
    assert heat["steps"] == list(range(STEPS)) and len(heat["layers"]) == LAYERS
    values = np.array(heat["values"])
    expected = np.outer(np.arange(1, STEPS + 1), np.arange(1, LAYERS + 1))
    np.testing.assert_allclose(values, expected, rtol=1e-6)  # float32 storage of integers up to 4e5
