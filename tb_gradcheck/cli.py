"""Command line: ``tb-gradcheck demo | report | export``.

``report`` exits 0 when every run is healthy, 1 when anything was found, and
2 for a usage or data error, so it can gate a CI job or a training script.
"""

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

EXIT_HEALTHY, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tb-gradcheck", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train two small runs on the CPU and open them in TensorBoard")
    demo.add_argument("--logdir", help="where to write the runs (default: a new temporary directory)")
    demo.add_argument("--steps", type=_positive, default=1000, help="training steps per run (default 1000)")
    demo.add_argument("--port", type=int, default=6006, help="TensorBoard port (default 6006)")
    demo.add_argument("--host", default="localhost", help="TensorBoard host (default localhost)")
    demo.add_argument("--no-serve", action="store_true", help="write the runs and exit without starting TensorBoard")
    demo.set_defaults(func=_demo)

    report = sub.add_parser("report", help="print findings (vanishing, exploding, dead, non-finite, check failures)")
    report.add_argument("logdir", help="the log directory TensorBoard would read")
    report.add_argument("--run", help="only this run (default: every run with gradient data)")
    report.add_argument("--format", choices=("text", "json"), default="text")
    report.add_argument(
        "--threshold", action="append", default=[], metavar="NAME=VALUE",
        help="override a diagnosis threshold, e.g. --threshold vanishing_orders=2 (repeatable)",
    )
    report.set_defaults(func=_report)

    export = sub.add_parser("export", help="write one heatmap matrix (steps x layers) as CSV or JSON")
    export.add_argument("logdir")
    export.add_argument("--run", required=True)
    export.add_argument("--metric", required=True, help="e.g. grad_norm, grad_zero_fraction, check_error")
    export.add_argument("--granularity", choices=("layer", "variable"), default="layer")
    export.add_argument("--aggregate", default="last", help="last, mean, max, min or sum (windowed runs)")
    export.add_argument("--format", choices=("csv", "json"), default="csv")
    export.add_argument("--output", "-o", help="file to write (default: standard output)")
    export.set_defaults(func=_export)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except _UsageError as e:
        print(f"tb-gradcheck {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR


class _UsageError(Exception):
    pass


def _open_store(logdir):
    from tb_gradcheck import store

    if not os.path.isdir(logdir):
        raise _UsageError(f"no such log directory: {logdir!r}")
    s, ctx, eid = store.local_store(logdir)
    runs = s.runs(ctx, eid)
    if not runs:
        raise _UsageError(f"no gradient data under {logdir!r} (write some with tb_gradcheck.GradientWriter)")
    return s, ctx, eid, runs


def _thresholds(pairs):
    from tb_gradcheck import diagnose

    fields = {f.name: f.type for f in dataclasses.fields(diagnose.Thresholds)}
    values = {}
    for pair in pairs:
        name, _, raw = pair.partition("=")
        if name not in fields or not raw:
            raise _UsageError(f"expected --threshold NAME=VALUE with NAME one of {sorted(fields)}, got {pair!r}")
        try:
            values[name] = int(raw) if fields[name] in (int, "int") else float(raw)
        except ValueError:
            raise _UsageError(f"threshold {name} must be a number, got {raw!r}") from None
    return diagnose.Thresholds(**values)


def _report(args):
    from tb_gradcheck import store

    thresholds = _thresholds(args.threshold)
    s, ctx, eid, runs = _open_store(args.logdir)
    names = sorted(runs) if args.run is None else [args.run]
    found = {}
    problems = {}
    for run in names:
        try:
            found[run] = s.findings(ctx, eid, run, thresholds)
        except store.NotFound as e:
            raise _UsageError(f"{e}; runs with gradient data: {sorted(runs)}") from None
        problems[run] = [p.to_dict() for p in runs[run].problems]
    healthy = not any(found.values())
    if args.format == "json":
        body = {
            "logdir": args.logdir,
            "healthy": healthy,
            "runs": {run: {"findings": [f.to_dict() for f in fs], "problems": problems[run]} for run, fs in found.items()},
        }
        print(json.dumps(body, indent=2, default=_json_default))
    else:
        for run, fs in found.items():
            print(f"run {run}: " + ("healthy" if not fs else f"{len(fs)} finding{'s' if len(fs) > 1 else ''}"))
            for f in fs:
                print(f"  {f.severity.upper():7} {f.kind:13} steps {f.steps[0]}-{f.steps[1]}")
                print(f"    {f.message}")
                for layer, numbers in f.evidence.items():
                    print(f"    - {layer}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in numbers.items()))
            for p in problems[run]:
                print(f"  unreadable tag {p['tag']}: {p['reason']}")
    return EXIT_HEALTHY if healthy else EXIT_FINDINGS


def _export(args):
    from tb_gradcheck import export, store

    s, ctx, eid, runs = _open_store(args.logdir)
    try:
        heat = s.heatmap(ctx, eid, args.run, args.metric, args.granularity, args.aggregate)
    except (store.NotFound, store.BadRequest) as e:
        raise _UsageError(str(e)) from None
    text = export.to_csv(heat) if args.format == "csv" else json.dumps(export.to_json(heat)) + "\n"
    if args.output:
        with open(args.output, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _json_default(v):
    return str(v)


def _demo(args):
    from tb_gradcheck import demo

    logdir = args.logdir or tempfile.mkdtemp(prefix="tb_gradcheck_demo_")
    started = time.time()
    runs = demo.write_runs(logdir, steps=args.steps)
    print(f"Wrote {len(runs)} runs to {logdir} in {time.time() - started:.1f} s: {', '.join(os.path.basename(r) for r in runs)}")
    if args.no_serve:
        return 0
    from tensorboard import program

    tb = program.TensorBoard()
    tb.configure(argv=[None, "--logdir", logdir, "--host", args.host, "--port", str(args.port)])
    url = tb.launch()
    print(f"Gradients tab: {url}#gradients")
    print("Press Ctrl-C to stop.")
    sys.stdout.flush()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


if __name__ == "__main__":
    sys.exit(main())
