"""The findings read PyTorch runs as they read TensorFlow's: torch twins of corpus scenarios get the same findings.

Each twin trains the scenario's network, data and optimizer in PyTorch
(modules named as the Keras layers are, so the expectations name the same
layers without the model's scope), checks the same premise, and is scored
with ``corpus.score`` against the same ``Expect``s, read through the
plugin's ``findings`` route on TensorBoard's Python data path.
"""

import collections
import math

import corpus
import numpy as np
import pytest
import torch
from corpus.healthy import _batches
from corpus.healthy import _regression
from corpus.registry import Expect
from torch import nn

from tb_gradcheck.torch import GradientWriter

# One intra-op thread: these models are tiny, and on a shared 2-core machine PyTorch's thread pool made
# each step tens of times slower than one thread.
torch.set_num_threads(1)


def _mlp(widths, activation, init, features=16):
    layers = collections.OrderedDict()
    for i, width in enumerate(widths):
        layers[f"dense_{i}"] = nn.Linear(features if i == 0 else widths[i - 1], width)
        layers[f"act_{i}"] = activation()
        if init == "he_normal":  # Keras' he_normal: truncated normal, std sqrt(2 / fan_in), zero bias
            fan_in = layers[f"dense_{i}"].in_features
            nn.init.trunc_normal_(layers[f"dense_{i}"].weight, std=math.sqrt(2.0 / fan_in) / 0.87962566)
            nn.init.zeros_(layers[f"dense_{i}"].bias)
    layers["out"] = nn.Linear(widths[-1], 1)
    return nn.Sequential(layers)


def _train(run_dir, model, batches, optimizer, every_n_steps=1):
    """Trains with MSE; returns (losses, per-step total gradient norms, first non-finite step or None).

    The writer records what the corpus' ``custom_loop`` records: the
    gradients, not the optimizer's update (whose own findings, layers that
    do not learn, the TensorFlow scenarios never see).
    """
    losses, norms, first_bad = [], [], None
    with GradientWriter(run_dir, model, every_n_steps=every_n_steps) as writer:
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
            loss.backward()
            grads = [p.grad for p in model.parameters()]
            norms.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))
            if first_bad is None and not all(bool(torch.isfinite(g).all()) for g in grads):
                first_bad = step
            writer.write(step)
            optimizer.step()
            losses.append(float(loss.detach()))
    return np.array(losses), np.array(norms), first_bad


def deep_sigmoid(run_dir):
    """corpus deep_sigmoid: 10 sigmoid layers, U[-1/sqrt(n), 1/sqrt(n)] (PyTorch's default Linear init), SGD 0.1."""
    torch.manual_seed(20)
    x, y = _regression(20)
    model = _mlp([64] * 10, nn.Sigmoid, None)
    _train(run_dir, model, _batches(x, y, 64, 200, 20), torch.optim.SGD(model.parameters(), 0.1))
    return {}, []


def lr_diverges(run_dir, every_n_steps=1):
    """corpus lr_diverges: SGD far above 2 / the largest Hessian eigenvalue; rises, then NaN."""
    torch.manual_seed(23)
    x, y = _regression(23)
    model = _mlp([32, 32], nn.ReLU, "he_normal")
    _, norms, first_bad = _train(
        run_dir, model, _batches(x, y * 10, 64, 40, 23), torch.optim.SGD(model.parameters(), 0.5), every_n_steps
    )
    end = first_bad if first_bad is not None else len(norms)
    rise = float(np.log10(np.nanmax(norms[:end]) / norms[0]))
    return {"first_nonfinite_step": first_bad}, [
        ("NaN within 10 steps", first_bad is not None and first_bad < 10),
        ("after a rise of 3+ orders", rise >= 3.0),
    ]


def dead_negative_bias(run_dir):
    """corpus dead_negative_bias: 60 of dense_1's 64 ReLU units (94%) start with bias -20 and never fire."""
    torch.manual_seed(24)
    x, y = _regression(24)
    model = _mlp([64, 64, 64], nn.ReLU, "he_normal")
    with torch.no_grad():
        model.dense_1.bias[:60] = -20.0
    _train(run_dir, model, _batches(x, y, 64, 200, 24), torch.optim.Adam(model.parameters(), 1e-3))
    with torch.no_grad():
        h = model.act_1(model.dense_1(model.act_0(model.dense_0(torch.from_numpy(x)))))
    share = float((h <= 0).all(dim=0).float().mean())
    return {"dead_share_dense_1": share}, [("90% or more of dense_1 is dead", share >= 0.9)]


_DIVERGE = (
    # PyTorch's float32 arithmetic keeps out.weight's gradient finite (3e33) at
    # the step where both hidden layers' overflow, and Keras' does not: the
    # output layer goes non-finite one step later here, so it may be named
    # then (no earlier) rather than must be named at the first NaN.
    Expect("non_finite", ("dense_0", "dense_1"), allowed="out", at="first_nonfinite_step", severity="error"),
    Expect("exploding", ("out",), allowed=r"dense_[01]", before="first_nonfinite_step", severity="error"),
)
TWINS = {
    "deep_sigmoid": (
        deep_sigmoid,
        (Expect("vanishing", ("dense_0", "dense_1"), allowed=r"dense_[2-6]", severity="warning"),),
    ),
    "lr_diverges": (lr_diverges, _DIVERGE),
    "lr_diverges_every_10": (lambda run_dir: lr_diverges(run_dir, every_n_steps=10), _DIVERGE),
    "dead_negative_bias": (dead_negative_bias, (Expect("dead", ("dense_1",), severity="warning"),)),
}


@pytest.mark.parametrize("name", sorted(TWINS))
def test_torch_twin_of_a_corpus_scenario_gets_its_expected_findings(tmp_path, name):
    train, expect = TWINS[name]
    # The same findings as the TensorFlow scenario's (whose layers are under "mlp/"), the same layers or fewer.
    tf_expect = corpus.SCENARIOS[name].expect
    assert [(e.kind, e.severity) for e in expect] == [(e.kind, e.severity) for e in tf_expect]
    for mine, theirs in zip(expect, tf_expect):
        assert {"mlp/" + n for n in mine.layers} <= set(theirs.layers)
    numbers, claims = train(str(tmp_path / name))
    assert all(ok for _, ok in claims), (claims, numbers)
    found = corpus.read_findings(tmp_path, [name])[name]
    scenario = corpus.Scenario(name, train, expect, train.__doc__ or "")
    score = corpus.score(scenario, found, numbers)
    described = [(f["severity"], f["kind"], f["layers"], f["steps"]) for f in found]
    assert not score.wrong, ("false alarms", score.wrong, described)
    assert not score.missed, ("missed", score.missed, described)
    assert not score.wrong_severity, ("severity", score.wrong_severity, described)
