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


def test_dead_by_output_agrees_with_what_the_units_output(results):
    """torch_dying_relu_activations: the dead finding's dead-by-output share is the share of units the run's own forward pass finds silent.

    The writer counts a unit dead on a batch (64 examples) when its ReLU gives no positive value on it; the
    scenario counts it on all 1024 examples at the end. A unit silent on all is silent on every batch, so the
    batch view is at least the whole-data one, and above it only by units that fire on a few examples: 0.1
    (6 of 64 units) allows for those and for the window's median not being the last step.
    """
    result = results("torch_dying_relu_activations")
    (f,) = [f for f in result.findings if f["kind"] == "dead"]
    for layer in ("dense_1", "dense_2"):
        by_output, silent = f["evidence"][layer]["dead_by_output"], result.numbers[f"silent_{layer}_end"]
        assert silent - 1 / 64 <= by_output <= silent + 0.1, (layer, by_output, silent)
        assert not f["evidence"][layer]["views_disagree"]


def test_a_healthy_llama_has_its_forward_side_recorded(tmp_path):
    """llama_plain_loop_activations: its no-finding is about recorded outputs: every block's act_rms is there, finite."""
    import numpy as np
    from corpus import unseen
    from corpus.registry import deterministic

    from conftest import get_json
    from conftest import make_app

    with deterministic():
        unseen.llama_plain_loop_activations(str(tmp_path / "llama"))
    client, _ = make_app(tmp_path, "python")
    body = get_json(client, "/data/plugin/gradients/heatmap?run=llama&metric=act_rms&granularity=layer")
    rows = {layer: [v for v in column] for layer, column in zip(body["layers"], zip(*body["values"]))}
    for block in ("model.layers.0", "model.layers.1"):
        for layer in (f"{block}.mlp.down_proj", f"{block}.self_attn.o_proj", f"{block}.input_layernorm"):
            values = np.array([np.nan if v is None else v for v in rows[layer]], float)
            assert np.isfinite(values).all() and (values > 0).all(), (layer, values[:5])


def test_saturation_from_the_first_write_starts_at_it(results):
    """torch_tanh_large_init_activations: saturated at initialisation (its premise), so the finding starts at step 0.

    The trailing window confirms it a few writes later (``confirmed_at_step``); like vanishing and dead, the
    finding dates the layer from the start of the unbroken run of saturated writes.
    """
    (f,) = [f for f in results("torch_tanh_large_init_activations").findings if f["kind"] == "saturated"]
    for layer in ("dense_1", "dense_2"):
        e = f["evidence"][layer]
        assert e["first_step"] == 0 < e["confirmed_at_step"], (layer, e)
