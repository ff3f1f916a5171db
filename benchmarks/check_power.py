"""What the gradient check finds, over many seeds: planted bugs caught per mode, and false mismatches on correct models.

Modes: ``default`` (float32, ``check_gradients`` as it is), ``thorough``
(float32, ``thorough=True``) and ``float64`` (the default check on
``float64_twin`` of the same model). Models: ``tests/check_models.py``, the
same ones the test suite uses with a few seeds.

Rows (``run()``):

- per planted kind and mode: the fraction of seeds at which a wrong layer is
  a mismatch and no correct layer is (``1 = every seed``); target >= 0.95
  for the modes the kind is documented to be caught by;
- one element wrong by 100% in a 64 x 64 kernel (4,096 parameters), thorough
  mode, float32: target >= 0.95;
- per mode: false mismatches over every row (layers and variables) of the
  correct models at every seed; target 0 over >= 5,000 rows.

    python -m benchmarks --only check_power          # 20 seeds per bug, 72 per correct model
    python -m benchmarks --only check_power --quick  # 3 and 5: a smoke run
"""

import os
import sys
import time
import warnings

from benchmarks.common import row

MODES = ("default", "thorough", "float64")
# The modes each planted kind is documented to be caught by at >= 95% of seeds.
CAUGHT_BY = {
    "scale": MODES,
    "sign": MODES,
    "transpose": MODES,
    "row": MODES,
    "column": MODES,
    "stop_gradient": MODES,
    "layer_norm": MODES,
    "attention": MODES,
    "element": ("thorough", "float64"),
    "bias_mean": ("thorough", "float64"),
    "leaky_relu": ("thorough", "float64"),
}


def run(quick=False):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tests import check_models  # the test-support module the suite uses; the repository root is on the path

    bug_seeds = range(3 if quick else 20)
    clean_seeds = range(5 if quick else 72)
    rows = []
    for kind in check_models.PLANTED_KINDS:
        case32, wrong = check_models.planted(kind)
        cases = {"default": case32, "thorough": case32, "float64": case32.float64()}
        for mode in MODES:
            found, evaluations = _detect(cases[mode], wrong, bug_seeds, thorough=mode == "thorough")
            claimed = mode in CAUGHT_BY[kind]
            rows.append(
                row(
                    f"planted {kind}: caught, {mode} ({evaluations:.0f} evaluations per check)",
                    None,
                    found,
                    "fraction of seeds",
                    lower_is_better=False,
                    limit=0.95 if claimed else None,
                )
            )
    case, wrong = check_models.planted("element", width=64)
    found, evaluations = _detect(case, wrong, bug_seeds, thorough=True)
    rows.append(
        row(
            f"planted element in a 64x64 kernel: caught, thorough float32 ({evaluations:.0f} evaluations)",
            None,
            found,
            "fraction of seeds",
            lower_is_better=False,
            limit=0.95,
        )
    )

    for mode in MODES:
        total, false, started = 0, 0, time.time()
        for kind in check_models.CLEAN_KINDS:
            case = check_models.clean(kind)
            if mode == "float64":
                case = case.float64()
            for seed in clean_seeds:
                report = _check(case.reseed(seed), seed, thorough=mode == "thorough", granularity="variable")
                total += len(report.rows)
                false += len(report.failures)
        rows.append(
            row(
                f"false mismatches, {mode}, over {total:,} rows of {len(check_models.CLEAN_KINDS)} correct "
                f"models x {len(clean_seeds)} seeds ({time.time() - started:.0f} s)",
                None,
                false,
                "rows",
                limit=0,
            )
        )
        rows[-1]["met"] = rows[-1]["met"] and (quick or total >= 5000)
    return rows


def _check(case, seed, **kwargs):
    from tb_gradcheck import check_gradients

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return check_gradients(case.loss, case.variables, seed=seed, **kwargs)


def _detect(case, wrong, seeds, thorough):
    """(fraction of seeds where a wrong layer mismatches and no right one does, mean evaluations)."""
    hits, evaluations = 0, 0
    for seed in seeds:
        report = _check(case.reseed(seed), seed, thorough=thorough)
        status = {r.name: r.status for r in report.layers}
        hits += any(status[n] == "mismatch" for n in wrong) and all(
            s != "mismatch" for n, s in status.items() if n not in wrong
        )
        evaluations += report.evaluations
    return hits / len(seeds), evaluations / len(seeds)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.__main__ import print_table

    print_table(run(quick="--quick" in sys.argv))
