"""Runs every benchmark and prints one table: ``python -m benchmarks [--quick] [--only NAME ...]``.

Each module in this package with a ``run(quick=False)`` function contributes
rows; every figure is a ratio against a baseline measured in the same run.
"""

import argparse
import importlib
import json
import math
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODULES = (
    "writer",
    "writer_mlp",
    "writer_parts",
    "torch",
    "torch_models",
    "check_cost",
    "check_power",
    "torch_check",
    "findings",
    "findings_scale",
    "backend",
    "listing",
    "frontend",
    "load",
    "align",
    "jax",
    "jax_models",
    "jax_check",
)
# Run only when named: parts of another module (a whole run has them already), or a breakdown of one.
SUBSETS = ("writer_mlp", "writer_parts")
# Benchmarks whose module is named otherwise (benchmarks/torch.py or jax.py would read as the framework itself).
MODULE_FILES = {"torch": "torch_writer", "jax": "jax_writer"}


def print_table(rows, out=sys.stdout):
    headers = ["benchmark", "baseline", "value", "unit", "ratio", "target", "met"]
    lines = []
    for r in rows:
        target = r.get("target")
        lower = r.get("lower_is_better", True)
        met = r.get("met")
        sign = "<= " if lower else ">= "
        goal = "" if target is None else sign + _num(target)
        if r.get("limit") is not None:
            goal = (goal + ", " if goal else "") + f"value {sign}{_num(r['limit'])} {r.get('unit', '')}".rstrip()
        lines.append(
            [
                r["name"],
                _num(r.get("baseline")),
                _num(r.get("value")),
                r.get("unit", ""),
                _num(r.get("ratio")),
                goal,
                "" if met is None else ("yes" if met else "NO"),
            ]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |", file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for line in lines:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |", file=out)


def _num(v):
    if v is None:
        return ""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    if isinstance(v, (int, float)):
        return f"{v:.4g}"
    return str(v)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and smaller models (a smoke run)")
    parser.add_argument("--only", nargs="*", choices=MODULES, help="run only these benchmark modules")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    # The real models' settings (torch_models, jax_models), passed as the environment variables they read.
    parser.add_argument("--models", nargs="+", help="torch_models / jax_models: of gpt2, resnet50 (default both)")
    parser.add_argument("--size", choices=("small", "train"), help="their sizes (default train with a GPU, else small)")
    parser.add_argument(
        "--compile", choices=("0", "1", "both"), help="torch_models: torch.compile (default both on CUDA)"
    )
    parser.add_argument("--rounds", type=int, help="their interleaved rounds (default 3 small, 5 train)")
    parser.add_argument("--threads", type=int, help="torch_models: torch.set_num_threads on a CPU")
    args = parser.parse_args(argv)
    for flag, name in (
        ("models", "MODELS"),
        ("size", "SIZE"),
        ("compile", "COMPILE"),
        ("rounds", "ROUNDS"),
        ("threads", "THREADS"),
    ):
        value = getattr(args, flag)
        if value is not None:
            os.environ[f"TB_GRADCHECK_BENCH_{name}"] = ",".join(value) if isinstance(value, list) else str(value)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    rows = []
    for name in args.only or [m for m in MODULES if m not in SUBSETS]:
        try:
            module = importlib.import_module(f"benchmarks.{MODULE_FILES.get(name, name)}")
        except ModuleNotFoundError as e:
            if e.name == f"benchmarks.{MODULE_FILES.get(name, name)}":
                print(f"(benchmark {name} not present)")
                continue
            raise
        started = time.time()
        rows += module.run(quick=args.quick)
        print(f"{name}: {time.time() - started:.0f} s", file=sys.stderr)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r.get("met") is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
