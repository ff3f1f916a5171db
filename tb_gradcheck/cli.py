"""Command line: ``tb-gradcheck demo``."""

import argparse
import os
import sys
import tempfile
import time


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

    args = parser.parse_args(argv)
    return args.func(args)


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
