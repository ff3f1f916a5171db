"""tb_gradcheck.torch.check_gradients against torch.autograd.gradcheck (fast_mode off and on), on the same float64 models.

For each model of tests/torch_check_models.py (the planted bugs in custom
autograd Functions, and correct models), in float64 (``model.double()``,
the batch cast), over the same seeds (each seed redraws weights and batch):

- ``check_gradients(loss_fn, model, seed=seed)``: the default check, at
  float64's default tolerance (4.3e-7);
- ``torch.autograd.gradcheck`` of the loss as a function of every
  parameter (``torch.func.functional_call``), with its defaults (eps 1e-6,
  atol 1e-5, rtol 1e-3), ``fast_mode=False`` (the full Jacobian: two
  evaluations per parameter) and ``fast_mode=True`` (one random
  projection per parameter tensor).

Counted: loss evaluations (calls of the loss: every forward pass, those
under a backward pass included), wall time (after one untimed warm-up), planted bugs caught (and on which row: the
check says the layer, gradcheck the first input whose Jacobian is wrong,
mapped to its layer) and false alarms on the correct models. Rows for the
shared table are ratios against gradcheck measured in the same run; the
per-model table is printed as well.

    python -m benchmarks --only torch_check
"""

import re
import sys
import time
import warnings

SEEDS = range(5)
QUICK_SEEDS = range(2)
PLANTED = ("scale", "sign", "input_sign", "transpose", "layer_norm", "attention", "element", "bias_mean")
CLEAN = ("mlp", "cnn", "layer_norm", "attention", "embedding", "relu_padded", "wide_mlp")
METHODS = ("check_gradients", "gradcheck", "gradcheck fast_mode")


def run(quick=False):
    """Measures the three methods on every model; prints the per-model table, returns the summary rows."""
    import torch

    from benchmarks.common import row

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only spin-waits
    try:
        results = _measure(QUICK_SEEDS if quick else SEEDS, quick)
    finally:
        torch.set_num_threads(threads)
    print_results(results)
    total = {m: {k: sum(r[m][k] for r in results) for k in ("evaluations", "seconds", "runs")} for m in METHODS}
    planted = [r for r in results if r["wrong"]]
    clean = [r for r in results if not r["wrong"]]
    caught = {m: sum(r[m]["caught"] for r in planted) for m in METHODS}
    on_row = {m: sum(r[m]["on_row"] for r in planted) for m in METHODS}
    false = {m: sum(r[m]["caught"] for r in clean) for m in METHODS}
    runs = sum(r["check_gradients"]["runs"] for r in planted)
    out = []
    for baseline in METHODS[1:]:
        out.append(
            row(
                f"loss evaluations, torch check_gradients vs {baseline} (all {len(results)} float64 models, every seed)",
                total[baseline]["evaluations"],
                total["check_gradients"]["evaluations"],
                "evaluations",
            )
        )
        out.append(
            row(
                f"wall time, torch check_gradients vs {baseline} (same runs)",
                total[baseline]["seconds"],
                total["check_gradients"]["seconds"],
                "s",
            )
        )
        out.append(
            row(
                f"planted bugs caught on a wrong row, check_gradients vs {baseline} ({runs} model-seeds)",
                on_row[baseline],
                on_row["check_gradients"],
                "caught",
                lower_is_better=False,
                target=1.0,
            )
        )
    for method in METHODS:
        out.append(
            row(
                f"false alarms on correct float64 models, {method} "
                f"({sum(r[method]['runs'] for r in clean)} model-seeds)",
                None,
                float(false[method]),
                "runs",
                limit=0.0 if method == "check_gradients" else None,
            )
        )
    out.append(
        row(
            f"planted bugs caught (any row), check_gradients: {caught['check_gradients']} of {runs}",
            None,
            float(caught["check_gradients"]),
            "caught",
            lower_is_better=False,
        )
    )
    return out


def _measure(seeds, quick):
    import torch

    from tb_gradcheck.torch import check_gradients
    from tests import torch_check_models as models  # the test-support module the suite uses

    # Warm-up, untimed: the first call of each method pays for imports and lazy initialisation.
    warm = _float64(models.clean("mlp", 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_gradients(warm.closure(), warm.model, seed=0)
    _gradcheck(torch, warm, [n for n, _ in warm.model.named_parameters()], [0], True)
    results = []
    cases = [("planted", k) for k in PLANTED] + [("clean", k) for k in CLEAN if not (quick and k == "wide_mlp")]
    for family, kind in cases:
        entry = {"model": f"{kind}" if family == "clean" else f"bug: {kind}", "wrong": None}
        entry.update({m: {"evaluations": 0, "seconds": 0.0, "runs": 0, "caught": 0, "on_row": 0} for m in METHODS})
        for seed in seeds:
            case = _float64(_case(models, family, kind, seed))
            names = [n for n, _ in case.model.named_parameters()]
            entry["wrong"] = case.wrong
            entry["params"] = sum(p.numel() for p in case.model.parameters())
            calls = [0]

            def loss_fn(case=case, calls=calls):
                calls[0] += 1
                return case.loss(case.model, case.batch)

            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = check_gradients(loss_fn, case.model, seed=seed)
            failed = [r.name for r in report.failures]
            _add(entry["check_gradients"], calls[0], time.perf_counter() - start, failed, case.wrong)
            for fast in (False, True):
                torch.manual_seed(seed)  # fast mode's random vectors
                calls[0] = 0
                start = time.perf_counter()
                failed = _gradcheck(torch, case, names, calls, fast)
                method = "gradcheck fast_mode" if fast else "gradcheck"
                _add(entry[method], calls[0], time.perf_counter() - start, failed, case.wrong)
        results.append(entry)
    return results


def _case(models, family, kind, seed):
    if family == "planted":
        return models.planted(kind, seed)
    if kind == "wide_mlp":
        import torch
        from torch import nn

        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 1))
        generator = torch.Generator().manual_seed(seed + 1000)
        x, y = torch.randn(64, 32, generator=generator), torch.randn(64, 1, generator=generator)
        return models.Case(model, (x, y), models.mse)
    return models.clean(kind, seed)


def _float64(case):
    case.model.double()
    case.batch = tuple(t.double() if t.is_floating_point() else t for t in case.batch)
    return case


def _add(stats, evaluations, seconds, failed, wrong):
    """``failed``: the rows said to be wrong (None: caught, row unknown; []: nothing caught)."""
    stats["evaluations"] += evaluations
    stats["seconds"] += seconds
    stats["runs"] += 1
    if failed is None or failed:
        stats["caught"] += 1
        if wrong and failed and any(f in wrong for f in failed):
            stats["on_row"] += 1


def _gradcheck(torch, case, names, calls, fast):
    """torch.autograd.gradcheck of the loss over every parameter; the rows it blames ([] if it passes, None if unsaid)."""
    from torch.autograd.gradcheck import GradcheckError

    from tb_gradcheck.torch.evaluator import owner

    inputs = tuple(p.detach().clone().requires_grad_(True) for p in case.model.parameters())

    class Bound:
        def __init__(self, values):
            self.values = values

        def __call__(self, x):
            return torch.func.functional_call(case.model, dict(zip(names, self.values)), (x,))

    def f(*values):
        calls[0] += 1
        return case.loss(Bound(values), case.batch)

    try:
        torch.autograd.gradcheck(f, inputs, fast_mode=fast)
    except GradcheckError as e:
        found = re.search(r"with respect to input (\d+)", str(e))
        return [owner(names[int(found.group(1))])] if found else None
    return []


def print_results(results, out=sys.stdout):
    """The per-model table: for each model and method, caught / runs (on a wrong row), evaluations and time per run."""
    print("", file=out)
    header = "| model | params | " + " | ".join(f"{m}: caught, ev./run, ms/run" for m in METHODS) + " |"
    print(header, file=out)
    print("|" + "---|" * (2 + len(METHODS)), file=out)
    for r in results:
        cells = []
        for m in METHODS:
            s = r[m]
            verdict = f"{s['caught']}/{s['runs']}"
            if r["wrong"]:
                verdict += f" ({s['on_row']} on row)"
            cells.append(f"{verdict}, {s['evaluations'] / s['runs']:.0f}, {1e3 * s['seconds'] / s['runs']:.0f}")
        print(f"| {r['model']} | {r['params']:,} | " + " | ".join(cells) + " |", file=out)
    print("", file=out)


if __name__ == "__main__":
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    print_table(run(quick="--quick" in sys.argv))
