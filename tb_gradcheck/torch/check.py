"""Numeric-vs-analytic gradient check per layer for PyTorch: the TensorFlow check's algorithm on a torch evaluator.

The algorithm (rows, noise, probes, steps, error bars, verdicts, bisection,
the report) is ``algorithm``'s, written once for every framework; this
module validates PyTorch's arguments, names the rows (the module path that
owns each parameter, as the writer names them), builds the float64 twin,
turns TensorFloat-32 off, and runs ``algorithm`` on a
``Evaluator``. The report is the same ``GradientCheckReport``
the TensorFlow check returns, for ``GradientWriter.write_check``.
"""

import contextlib
import copy
import os
import warnings

import torch

from tb_gradcheck.check import algorithm
from tb_gradcheck.check import float32_gap
from tb_gradcheck.check import settle
from tb_gradcheck.core import validate
from tb_gradcheck.torch import modules
from tb_gradcheck.torch.evaluator import Evaluator
from tb_gradcheck.torch.evaluator import gradients
from tb_gradcheck.torch.evaluator import parameters

DTYPES = (None, "float32", "float64")


def check_gradients(
    loss_fn,
    model,
    batch=None,
    *,
    dtype=None,
    probes=algorithm.DEFAULT_PROBES,
    epsilon=None,
    seed=None,
    granularity="layer",
    tolerance=None,
    thorough=False,
):
    """Checks the analytic gradient of a PyTorch loss against central differences, per layer.

    Example:

        report = tb_gradcheck.torch.check_gradients(
            lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]), model, (x, y),
            dtype="float64", seed=step)
        writer.write_check(report, step)
        assert report.ok, report.failures

    Rows are layers: the module that owns each parameter, by its
    ``named_modules`` path (``encoder.0`` for ``encoder.0.weight``; a
    parameter directly on the root module is its own row, by its name), in
    the order of ``named_parameters``; with ``granularity="variable"`` also
    each parameter, by its ``named_parameters`` name.

    The model is evaluated in the mode it is in. In training mode, every
    evaluation starts the random number generators from the same seed
    (forked: the caller's are not advanced), so dropout draws the same mask
    at every point, and the buffers a module writes (BatchNorm's running
    statistics) are put back after each, so every evaluation sees the same
    function; a warning names the buffers. Call ``model.eval()`` first to
    check the inference-mode gradient without either.

    Args:
      loss_fn: The loss as a callable returning a scalar floating-point
        tensor: ``loss_fn()`` (a closure over a fixed batch) when ``batch``
        is None, else ``loss_fn(model, batch)``. Gradients come from
        ``torch.autograd.grad``: ``.grad`` is never written.
      model: A ``torch.nn.Module`` (its parameters that require grad are
        checked; every parameter and buffer is restored bit for bit), a dict
        of named parameters, an iterable of ``(name, parameter)`` pairs, or
        of parameters (named by position).
      batch: None (default), or the batch ``loss_fn(model, batch)`` takes:
        a tensor or a tuple, list or dict of them.
      dtype: None (default) checks the model as it is, then re-checks the
        rows it does not convict (inconclusive, or ok only within float32's
        1%) on the float64 twin below, with the same seed and probes
        (``tb_gradcheck.check.settle``): those rows hold the twin's verdict,
        marked ``float64_recheck="float64"``, or their own (the inconclusive
        ones marked ``"unavailable"`` with the reason) where the twin cannot
        run (no ``batch``, bare parameters, a module ``deepcopy`` refuses,
        an op that refuses float64, not enough free memory).
        ``"float32"`` checks the model as it is, and nothing more.
        ``"float64"`` checks a
        float64 twin: ``copy.deepcopy(model)`` cast to float64, called as
        ``loss_fn(twin, batch)`` with the batch's floating-point tensors cast
        to float64 and float64 as the default dtype (so tensors ``loss_fn``
        makes are float64 too), and its casts to float32 (``.float()``,
        ``dtype=torch.float32``: Hugging Face's losses, RMSNorms and
        attention softmax upcast so) made to float64; the model itself is only read. The twin's
        error bar is ~1e-7 of the derivative instead of ~3e-3, so errors
        that are a small share of the gradient are caught at the default
        cost. A float32 model also has its own gradient held against the
        twin's (one backward pass of each): a row more than 1% off, or not
        finite where the twin's is, is a mismatch (float32 arithmetic the
        twin cannot see; ``float32_gap``); not when the twin's loss is not the
        model's (more than float32 rounding apart): from the same seed,
        float64 noise (``torch.randn``) is other numbers than float32's, and
        the report's ``notes`` say the gradients were not compared. The
        twin's own check is valid either way.
        Needs ``batch``.
      probes, epsilon, seed, granularity, tolerance, thorough: As for
        ``tb_gradcheck.check_gradients`` (TensorFlow): probes per row
        (default 3), the step as a fraction of the row's scale (None: chosen
        from the measured noise), the seed of the random directions and of
        every evaluation's random numbers (None: drawn, and recorded in the
        report), ``"layer"`` or ``"variable"``, the relative error above
        which a resolved difference is a mismatch (None: 0.01 in float32,
        4.3e-7 in float64), and blind-spot probes over 64-element blocks.

    TensorFloat-32 (and oneDNN's reduced float32 precision) is turned off
    while the check runs, so float32 models are checked in float32, and put
    back as it was.

    Returns:
      A ``GradientCheckReport`` (``tb_gradcheck.check.report``), the type
      the TensorFlow check returns.

    Raises:
      TypeError: ``loss_fn`` is not callable or does not return a
        floating-point tensor; ``model`` is not a module or parameters; an
        argument has the wrong type.
      ValueError: No parameters to check, a non-scalar loss, an argument
        out of range, or ``dtype="float64"`` without ``batch``.
      Anything ``loss_fn`` raises, after every parameter and buffer has been restored.
    """
    if not callable(loss_fn):
        raise TypeError(f"Expected `loss_fn` to be a callable. Received: {type(loss_fn).__name__}")
    opts = algorithm.options(probes, epsilon, seed, granularity, tolerance, thorough)
    dtype = validate.one_of(dtype, "dtype", DTYPES)
    if dtype != "float64":
        fn = loss_fn if batch is None else (lambda: loss_fn(model, batch))
        report = _check(fn, model, opts)
        if dtype is None:
            report = settle.settle(report, lambda only: _recheck(loss_fn, model, batch, opts, only))
        return report
    if batch is None:
        raise ValueError(
            "Expected `batch` with dtype='float64': the twin's loss is loss_fn(twin, batch) with the batch in "
            "float64. Received: batch=None"
        )
    return _twin_check(loss_fn, model, batch, opts)


def _recheck(loss_fn, model, batch, opts, only):
    """The float64 twin's report over the rows ``only`` (``settle``'s ``recheck``), or why there is none."""
    if batch is None:
        raise settle.TwinUnavailable(
            "loss_fn() closes over the model, so it cannot run on a float64 copy; pass loss_fn(model, batch) and "
            "the batch"
        )
    if not isinstance(model, torch.nn.Module):
        raise settle.TwinUnavailable(
            f"the parameters came without their module ({type(model).__name__}), so there is nothing to copy; "
            "pass the torch.nn.Module"
        )
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
    if tensors:
        # The twin's float64 tensors, and the evaluator's float64 snapshot of them.
        needed = 2 * 8 * sum(t.numel() for t in tensors)
        settle.require_memory(needed, _free_bytes(tensors[0].device), str(tensors[0].device))
    try:
        return _twin_check(loss_fn, model, batch, opts, only)
    except TypeError as e:  # float64_twin: a module deepcopy refuses
        raise settle.TwinUnavailable(str(e)) from e


def _free_bytes(device):
    """Bytes free on ``device``, or None when it cannot say."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu" and hasattr(os, "sysconf"):
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    return None


def _twin_check(loss_fn, model, batch, opts, only=None):
    """The check of ``model``'s float64 twin (over the rows ``only``, or all), its gradient held against the model's."""
    twin = float64_twin(model)
    batch64 = _to_float64(batch)

    def twin_fn():
        # Tensors loss_fn makes (torch.zeros, a constant) follow the
        # default dtype: float64 here, or they would round the twin's loss;
        # and its casts to float32 are casts to float64 (_Float64Casts).
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            with _Float64Casts():
                return loss_fn(twin, batch64)
        finally:
            torch.set_default_dtype(default)

    report = _check(twin_fn, twin, opts, only)
    names, checked, _ = parameters(model)
    if any(p.dtype != torch.float32 for p in checked):
        return report  # float16 or bfloat16 arithmetic is inexact by design; float64 is the twin's own
    own_fn = lambda: loss_fn(model, batch)  # noqa: E731
    layout = algorithm.Layout(names, [modules.owner_path(n) for n in names])
    with _ieee_float32():
        reference = gradients(twin_fn, twin, opts.seed)
        # From the same seed torch.randn draws other numbers in float64 than
        # in float32 (dropout's masks happen to agree on a CPU): own_gap holds
        # the two losses first, and compares the gradients only when the
        # twin computes the model's function.
        _, checked, state = parameters(model)
        own = Evaluator(own_fn, checked, state, opts.seed)
        try:
            return float32_gap.own_gap(report, own, reference, layout)
        finally:
            own.restore_all()


class _Float64Casts(torch.overrides.TorchFunctionMode):
    """Inside the twin's loss, a cast to float32 is a cast to float64.

    Code written for float16 and bfloat16 upcasts where precision matters:
    Hugging Face's losses take ``logits.float()``, its RMSNorms
    ``hidden_states.to(torch.float32)``, its eager attention
    ``softmax(..., dtype=torch.float32)``. In a float64 twin each of these
    rounds to float32 (a tiny Mixtral's twin returned a float32 loss, and 16
    of its 19 rows were inconclusive at float32's noise; with the casts
    widened, all 19 are ok, catching errors of 1e-6 of the derivative). What
    those casts ask for is "at least float32", which float64 is.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        kwargs = {k: torch.float64 if v is torch.float32 else v for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


def float64_twin(model):
    """A float64 copy of ``model`` (``copy.deepcopy``, then ``.double()``), holding its weights; ``model`` untouched.

    Raises:
      TypeError: ``model`` is not a ``torch.nn.Module``, or cannot be deep-copied.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"Expected a torch.nn.Module to make a float64 twin of. Received: {type(model).__name__}")
    try:
        twin = copy.deepcopy(model)
    except Exception as e:  # a module holding something deepcopy refuses (a lock, an open file)
        raise TypeError(
            f"Expected a module copy.deepcopy can copy. Received: {type(model).__name__} ({type(e).__name__}: {e})"
        ) from e
    for p in twin.parameters():
        p.grad = None  # the copy of the caller's .grad is not the twin's
    return twin.double()


def _check(fn, model, opts, only=None):
    names, checked, state = parameters(model)
    layout = algorithm.Layout(names, [modules.owner_path(n) for n in names])
    with _ieee_float32():
        evaluator = Evaluator(fn, checked, state, opts.seed)
        try:
            report = algorithm.run(evaluator, layout, opts, only)
        finally:
            changed = evaluator.restore_all()
    if changed:
        warnings.warn(
            f"loss_fn changed tensors other than the ones checked ({', '.join(sorted(changed))}), e.g. BatchNorm "
            "running statistics in training mode; check_gradients put them back after every evaluation and "
            "restored them bit for bit. Call model.eval() first to check the inference-mode gradient without this.",
            stacklevel=3,
        )
    return report


def _to_float64(batch):
    if isinstance(batch, torch.Tensor):
        return batch.to(torch.float64) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return type(batch)((k, _to_float64(v)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_to_float64(v) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_float64(v) for v in batch)
    return batch


# The precision settings of each backend that can compute float32 matmuls
# and convolutions with fewer mantissa bits (TF32 on NVIDIA GPUs, bfloat16
# in oneDNN): inputs rounded to 10 bits (2**-11 = 4.9e-4) or fewer, coarser
# than a float32 step of sqrt(u) = 2.4e-4, so most perturbed weights would
# not change inside the matmul and a difference would not be a derivative.
def _precision_settings():
    backends = torch.backends
    candidates = [
        getattr(backends, "cuda", None) and backends.cuda.matmul,
        getattr(backends, "cudnn", None) and getattr(backends.cudnn, "conv", None),
        getattr(backends, "cudnn", None) and getattr(backends.cudnn, "rnn", None),
        getattr(backends, "mkldnn", None) and getattr(backends.mkldnn, "matmul", None),
        getattr(backends, "mkldnn", None) and getattr(backends.mkldnn, "conv", None),
        getattr(backends, "mkldnn", None) and getattr(backends.mkldnn, "rnn", None),
    ]
    return [c for c in candidates if c is not None and hasattr(c, "fp32_precision")]


@contextlib.contextmanager
def _ieee_float32():
    """Float32 computed in float32 while the check runs; the caller's settings put back after."""
    settings = _precision_settings()
    if settings:  # torch >= 2.9: one setting per backend and op kind
        saved = [s.fp32_precision for s in settings]
        try:
            for s in settings:
                s.fp32_precision = "ieee"
            yield
        finally:
            for s, value in zip(settings, saved):
                s.fp32_precision = value
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
