"""The labelled corpus (tests/corpus): every scenario is what it claims, and gets exactly its expected findings.

Each scenario is trained once per session, when a test first needs it, and
read back through the plugin's ``findings`` route on TensorBoard's Python data
path. ResNet50 and MobileNetV2 dominate the time (tracing their train step). ``python -m benchmarks --only findings`` trains the same scenarios and
prints precision and recall.
"""

import corpus
import pytest

NAMES = sorted(corpus.SCENARIOS)


@pytest.fixture(scope="session")
def results(tmp_path_factory):
    """Scenario name -> ``corpus.Result``, each trained once, when a test first asks for it (so ``-k`` trains less)."""
    root = tmp_path_factory.mktemp("corpus")
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = corpus.run(root / name, [name])[name]  # its own log directory
        return cache[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_scenario_premise_holds(results, name):
    result = results(name)
    assert not result.broken_premises, (name, result.broken_premises, result.numbers)


@pytest.mark.parametrize("name", NAMES)
def test_scenario_gets_exactly_its_expected_findings(results, name):
    scenario = corpus.SCENARIOS[name]
    result = results(name)
    score = corpus.score(scenario, result.findings, result.numbers)
    described = [(f["severity"], f["kind"], f["layers"], f["steps"]) for f in result.findings]
    assert not score.wrong, ("false alarms", score.wrong, described)
    assert not score.missed, ("missed", score.missed, described)
    assert not score.wrong_severity, ("severity", score.wrong_severity, described)
    assert not score.errors_on_healthy, described


def test_every_scenario_says_where_it_comes_from():
    for name, scenario in corpus.SCENARIOS.items():
        assert len(scenario.doc) > 40, name
    healthy = [s for s in corpus.SCENARIOS.values() if s.healthy]
    sick = [s for s in corpus.SCENARIOS.values() if not s.healthy]
    assert len(healthy) >= 12 and len(sick) >= 9


def test_a_layer_cut_off_behind_a_silent_one_is_counted_by_it_and_named_dying_not_recovered(results):
    """dying_then_cut_off: dense_1 dying, then every unit of dense_2 dead: dense_0 and dense_1 get no gradient."""
    found = results("dying_then_cut_off").findings
    dead = {n: (f, e) for f, _ in corpus.claims(found) if f["kind"] == "dead" for n, e in f["evidence"].items()}
    assert set(dead) == {"dense_1", "dense_2"}, dead
    f, e = dead["dense_1"]
    assert f["severity"] == "warning" and e["state"] == "dying" and e["cut_off_behind"] == "dense_2"
    f, e = dead["dense_2"]
    assert e["state"] == "silent" and e["layers_cut_off_behind"] == 2
    assert "no gradient reaches the 2 layers before it" in f["message"]


def test_units_dead_from_initialisation_are_named_so(results):
    """dead_from_init_bias: most of dense_1 dead from step 0; under the silent bar at the end, and not recovered."""
    (f,) = [f for f in results("dead_from_init_bias").findings if f["kind"] == "dead" and "dense_1" in f["layers"]]
    e = f["evidence"]["dense_1"]
    assert f["severity"] == "warning" and e["state"] == "mostly_dead" and e["since"] == "initialisation"
    assert "dead from initialisation" in f["message"]
