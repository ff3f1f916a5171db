"""tb_gradcheck.torch.check_gradients: planted bugs in custom autograd Functions, correct models, kinks, state, twin, TF agreement.

A few seeds each, to stay fast; benchmarks/torch_check.py runs the same
models against torch.autograd.gradcheck.
"""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import torch_check_models as models
from tb_gradcheck.check.report import GradientCheckReport
from tb_gradcheck.torch import check_gradients

SEEDS = range(3)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: a second intra-op thread only spin-waits, and on a shared 2-core machine doubles the time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def check(case, seed, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here writes state: a warning would be news
        return check_gradients(case.loss, case.model, case.batch, seed=seed, **kwargs)


def assert_found(report, wrong):
    """A wrong row (at least one) is a mismatch located inside itself, and no other row is a mismatch."""
    status = {r.name: r.status for r in report.layers}
    assert any(status[name] == "mismatch" for name in wrong), status
    assert all(s != "mismatch" for name, s in status.items() if name not in wrong), status
    for row in report.failures:
        assert row.location == "" or row.location.startswith(row.name + "."), row.location


def bits(case):
    """Every parameter, buffer and .grad of the case's model, as bytes."""
    out = {n: t.detach().cpu().numpy().tobytes() for n, t in case.model.state_dict(keep_vars=True).items()}
    out.update(
        {f"{n}.grad": p.grad.cpu().numpy().tobytes() for n, p in case.model.named_parameters() if p.grad is not None}
    )
    return out


# -- planted bugs ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", models.PLANTED_KINDS)
def test_planted_bug_in_a_custom_function_is_a_mismatch_on_its_row_only_in_float32(kind):
    for seed in SEEDS:
        case = models.planted(kind, seed)
        report = check(case, seed)
        assert report.dtype == "float32" and report.tolerance == 0.01
        assert_found(report, case.wrong)


@pytest.mark.parametrize("kind, location", [("element", "body.2.weight[1, 2]"), ("bias_mean", "body.2.bias")])
def test_float64_twin_catches_and_locates_a_bug_confined_to_a_few_elements(kind, location):
    for seed in SEEDS[:2]:
        case = models.planted(kind, seed)
        before = bits(case)
        report = check(case, seed, dtype="float64")
        assert report.dtype == "float64" and report.tolerance < 1e-6
        assert_found(report, case.wrong)
        assert report.layers[1].location == location
        assert report.evaluations < 150  # the default probes: 9 + 12 per row, confirmations and bisection
        assert bits(case) == before  # the twin is a copy: the model is only read


def test_float64_twin_holds_the_models_own_gradient_against_its_own_for_float32_arithmetic_bugs():
    # The weight gradient is (dy + 1e4)^T x - 1e4 sum(x): exact in float64,
    # ~10% off in float32 from cancellation. The twin's function is right;
    # the gap between the two gradients is what convicts.
    for seed in SEEDS[:2]:
        case = models.planted("cancel", seed)
        report = check(case, seed, dtype="float64")
        status = {r.name: r.status for r in report.layers}
        assert status == {"body.0": "ok", "body.2": "mismatch", "head": "ok"}, status
        assert "off the float64 twin's" in report.layers[1].reason


# -- correct models ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ("mlp", "cnn", "layer_norm", "attention", "embedding"))
def test_correct_models_are_ok_in_float32_and_in_the_float64_twin(kind):
    for seed in SEEDS[:2]:
        case = models.clean(kind, seed)
        for dtype in (None, "float64") if seed == 0 else (None,):
            report = check(case, seed, granularity="variable", dtype=dtype)
            assert report.ok, (dtype, [(r.name, r.relative_error, r.probes) for r in report.failures])
            # Confirmed, not merely not convicted: a check answering
            # "inconclusive" everywhere would pass the line above.
            assert sum(r.status == "ok" for r in report.rows) >= 0.8 * len(report.rows), str(report)


def test_relu_kinks_are_inconclusive_never_a_mismatch():
    # Zero biases and zero-padded rows put most ReLU inputs exactly at 0.
    undecided = []
    for seed in SEEDS[:2]:
        report = check(models.clean("relu_padded", seed), seed, granularity="variable")
        assert report.ok, [(r.name, r.probes) for r in report.failures]
        undecided += [r.reason for r in report.inconclusive]
    assert undecided  # the kinks are seen, and said
    assert all("kink" in why or "not differentiable" in why for why in undecided), undecided


def test_a_parameter_exactly_at_a_relu_kink_is_inconclusive_with_the_kink_as_reason():
    at_kink = torch.nn.Parameter(torch.zeros(6))  # relu'(0) = 0 by convention; the loss has no derivative there
    smooth = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 5))
    report = check_gradients(
        lambda: torch.relu(at_kink).sum() + torch.tanh(smooth).sum(), {"at_kink": at_kink, "smooth": smooth}, seed=0
    )
    status = {r.name: (r.status, r.reason) for r in report.layers}
    assert status["smooth"][0] == "ok"
    assert status["at_kink"][0] == "inconclusive" and "kink" in status["at_kink"][1], status


# -- training mode, state -----------------------------------------------------------------------


def test_training_mode_sees_one_dropout_mask_and_batch_statistics_and_puts_everything_back():
    case = models.clean("train_mode", 0)
    before, rng = bits(case), torch.get_rng_state()
    with pytest.warns(UserWarning, match=r"1\.running_mean.*put them back after every evaluation"):
        report = check_gradients(case.loss, case.model, case.batch, seed=0, granularity="variable")
    # A fresh mask per evaluation would look like enormous noise and leave
    # nothing decided; the same mask every time makes it an ordinary function.
    assert report.ok and sum(r.status == "ok" for r in report.rows) >= 0.8 * len(report.rows), str(report)
    assert bits(case) == before and case.model.training
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's random numbers are not consumed


def test_a_backward_pass_wrong_only_in_training_mode_is_caught_in_training_mode():
    case = models.forgetful_dropout(0)  # the mask forgotten by its backward pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_found(check_gradients(case.loss, case.model, case.batch, seed=0), case.wrong)
        case.model.eval()  # no dropout, nothing to forget
        assert check_gradients(case.loss, case.model, case.batch, seed=0).ok


def test_twin_does_not_compare_gradients_of_a_loss_that_draws_random_numbers():
    # torch.randn draws other numbers in float64 than in float32 at the same
    # seed: the twin's noise is not the model's, and their gradients differ
    # by far more than precision on a correct model. The losses say so first.
    case = models.clean("noise", 0)
    report = check(case, 0, dtype="float64")
    assert report.ok and all(r.status == "ok" for r in report.layers), str(report)
    (note,) = report.notes
    assert "not the model's" in note and "not held against" in note, note


def test_twin_compares_gradients_of_a_dropout_model_whose_float64_mask_is_the_models():
    # On a CPU torch's dropout draws the same mask in float64 as in float32
    # from the same seed: the twin computes the model's loss, so the model's
    # own gradient is still held against it (no note).
    case = models.forgetful_dropout(0, dropout=torch.nn.Dropout)
    report = check(case, 0, dtype="float64")
    assert report.ok and all(r.status == "ok" for r in report.layers), str(report)
    assert report.notes == (), report.notes


def test_a_backward_pass_wrong_only_in_training_mode_is_caught_by_the_float64_twin():
    case = models.forgetful_dropout(0)
    assert_found(check(case, 0, dtype="float64"), case.wrong)


def test_same_seed_same_training_mode_report_whatever_the_callers_random_state():
    case = models.clean("train_mode", 0)
    reports = []
    for state in (1, 2):
        torch.manual_seed(state)
        with pytest.warns(UserWarning, match="running_mean"):
            reports.append(check_gradients(case.loss, case.model, case.batch, seed=0).to_dict())
    assert reports[0] == reports[1]


def test_parameters_buffers_and_grad_are_bit_identical_after_a_check():
    case = models.clean("cnn", 0)
    case.loss(case.model, case.batch).backward()  # a .grad the check must not touch
    case.model[0].weight.requires_grad_(False)  # frozen: not checked, still restored
    before, rng = bits(case), torch.get_rng_state()
    report = check(case, 0, granularity="variable", thorough=True)
    assert [r.name for r in report.variables] == ["0.bias", "2.weight", "2.bias", "5.weight", "5.bias"]
    assert bits(case) == before
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_loss_fn_that_raises_half_way_leaves_everything_bit_identical():
    case = models.clean("train_mode", 0)
    before, rng = bits(case), torch.get_rng_state()
    calls = []

    def loss_fn(model, batch):
        calls.append(1)
        if len(calls) == 30:  # inside the probes, with a row perturbed
            raise RuntimeError("planted failure")
        return models.mse(model, batch)

    with pytest.raises(RuntimeError, match="planted failure"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_gradients(loss_fn, case.model, case.batch, seed=0)
    assert len(calls) == 30
    assert bits(case) == before
    assert torch.equal(torch.get_rng_state(), rng)


def test_reduced_float32_precision_is_off_during_every_evaluation_and_restored_after():
    # oneDNN can run float32 matmuls in bfloat16 (8 mantissa bits): a step
    # of sqrt(u) would vanish inside the matmul. The check turns it off.
    matmul = torch.backends.mkldnn.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("torch < 2.9 has no per-backend fp32_precision")
    seen = []
    case = models.clean("mlp", 0)

    def loss_fn(model, batch):
        seen.append(matmul.fp32_precision)
        return models.mse(model, batch)

    saved = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        check_gradients(loss_fn, case.model, case.batch, seed=0, dtype="float64")
        assert matmul.fp32_precision == "bf16"
    finally:
        matmul.fp32_precision = saved
    assert seen and set(seen) == {"ieee"}


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (run it on one: see docs/gradient_check.md)"
)
def test_on_a_gpu_float32_is_checked_in_float32_with_tf32_off_and_everything_restored():
    # cuDNN runs float32 convolutions in TF32 by default (10 mantissa bits):
    # a step of sqrt(u) would vanish inside them. Checked with it off, a
    # correct CNN is ok and a planted bug found; the caller's settings, the
    # CUDA generator and every tensor are as they were.
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    saved = conv.fp32_precision, matmul.fp32_precision
    conv.fp32_precision = matmul.fp32_precision = "tf32"
    try:
        for case in (models.clean("cnn", 0), models.clean("train_mode", 0), models.planted("scale", 0)):
            case.model.cuda()
            case.batch = tuple(t.cuda() for t in case.batch)
            before, rng = bits(case), torch.cuda.get_rng_state()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # train_mode's BatchNorm statistics, put back and said
                report = check_gradients(case.loss, case.model, case.batch, seed=0, granularity="variable")
            if case.wrong:
                assert_found(report, case.wrong)
            else:
                assert report.ok and sum(r.status == "ok" for r in report.rows) >= 0.8 * len(report.rows), str(report)
            assert bits(case) == before and torch.equal(torch.cuda.get_rng_state(), rng)
            assert (conv.fp32_precision, matmul.fp32_precision) == ("tf32", "tf32")
    finally:
        conv.fp32_precision, matmul.fp32_precision = saved


# -- rows, report, arguments ----------------------------------------------------------------


class Scaled(torch.nn.Module):
    """A parameter on the root module, then two children."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(1.5))
        self.encoder = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.scale * self.head(self.encoder(x))


def test_rows_are_module_paths_in_parameter_order_and_a_root_parameter_is_its_own_row():
    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(5, 3)
    report = check_gradients(lambda: model(x).pow(2).mean(), model, seed=0, granularity="variable")
    assert [r.name for r in report.layers] == ["scale", "encoder.0", "head"]
    assert [r.name for r in report.variables] == [n for n, _ in model.named_parameters()]
    assert [r.size for r in report.layers] == [1, 16, 5]
    # The same rows from named parameters; positions name plain tensors.
    same = check_gradients(lambda: model(x).pow(2).mean(), model.named_parameters(), seed=0)
    assert [r.name for r in same.layers] == ["scale", "encoder.0", "head"]
    plain = check_gradients(lambda: model(x).pow(2).mean(), list(model.parameters()), seed=0)
    assert [r.name for r in plain.layers] == ["0", "1", "2", "3", "4"]


def test_same_seed_same_report_and_the_report_is_the_tensorflow_checks_type():
    case = models.planted("scale", 0)
    first, second = check(case, 7), check(case, 7)
    assert isinstance(first, GradientCheckReport)
    assert first.to_dict() == second.to_dict()
    assert first.seed == 7 and json.loads(json.dumps(first.to_dict()))["layers"][1]["status"] == "mismatch"
    assert "body.2" in str(first) and "mismatch" in str(first)
    other = check(case, 8)
    assert [p.analytic for p in other.layers[0].probes[1:]] != [p.analytic for p in first.layers[0].probes[1:]]


def test_bad_arguments_raise_clear_errors():
    case = models.clean("mlp", 0)
    loss = case.closure()
    with pytest.raises(TypeError, match="callable"):
        check_gradients(None, case.model)
    with pytest.raises(TypeError, match="single tensor"):
        check_gradients(loss, case.model[0].weight)
    with pytest.raises(TypeError, match="leaf tensors that require grad"):
        check_gradients(loss, [case.model[0].weight * 2])
    with pytest.raises(ValueError, match="requires? grad"):
        check_gradients(loss, torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(ValueError, match="at least one parameter"):
        check_gradients(loss, [])
    with pytest.raises(ValueError, match="`batch` with dtype='float64'"):
        check_gradients(loss, case.model, dtype="float64")
    with pytest.raises(ValueError, match="dtype"):
        check_gradients(case.loss, case.model, case.batch, dtype="float16")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check_gradients(case.loss, list(case.model.parameters()), case.batch, dtype="float64")
    with pytest.raises(ValueError, match="probes"):
        check_gradients(loss, case.model, probes=0)
    with pytest.raises(TypeError, match="scalar floating-point tensor"):
        check_gradients(lambda: 1.0, case.model)
    with pytest.raises(ValueError, match="scalar loss"):
        check_gradients(lambda: case.model(case.batch[0]), case.model)


def test_importing_and_running_the_torch_check_imports_no_tensorflow():
    code = (
        "import sys, torch\n"
        "import tb_gradcheck.torch as t\n"
        "w = torch.nn.Parameter(torch.ones(3))\n"
        "assert t.check_gradients(lambda: (w ** 2).sum(), [w], seed=0).ok\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- the same model in TensorFlow and in PyTorch --------------------------------------------


def test_the_same_mlp_in_tensorflow_and_torch_gives_the_same_statuses_and_derivatives():
    import tensorflow as tf

    import check_models
    import tb_gradcheck

    for factor, kind in ((1.0, None), (1.03, "scale")):
        case = models.planted(kind, 0)
        tf_case = check_models.mlp((8, 16, 16, 1), wrong_layer=1, factor=factor)
        # Keras kernels are (in, out), torch weights (out, in).
        for v, (_, p) in zip(tf_case.variables, case.model.named_parameters()):
            value = p.detach().numpy()
            v.assign(value.T if value.ndim == 2 else value)
        tf_case.x.assign(case.batch[0].numpy())
        tf_case.y.assign(case.batch[1].numpy())
        ours = check(case, 0, granularity="variable")
        theirs = tb_gradcheck.check_gradients(tf_case.loss, tf_case.variables, seed=0, granularity="variable")
        assert [r.status for r in ours.rows] == [r.status for r in theirs.rows], (str(ours), str(theirs))
        assert [r.status for r in ours.layers] == ["ok", "mismatch" if kind else "ok", "ok"]
        # The derivative along each row's gradient is |g| up to the rounding
        # of the applied perturbation (each element's sqrt(u) ~ 2.4e-4,
        # averaged over the row) and float32 accumulation order: 1e-3.
        for a, b in zip(ours.rows, theirs.rows):
            along_ours, along_theirs = a.probes[0], b.probes[0]
            assert along_ours.direction == along_theirs.direction == "gradient"
            np.testing.assert_allclose(along_ours.analytic, along_theirs.analytic, rtol=1e-3, err_msg=a.name)
        np.testing.assert_allclose(ours.loss, theirs.loss, rtol=1e-6)
        assert tf.executing_eagerly()
