"""Command line: ``tb-gradcheck demo | report | export``.

``report`` exits 1 when a finding reaches the gate (``--fail-on``: errors by
default, or warnings and errors, or never), 0 otherwise, and 2 for a usage or
data error, so it can gate a CI job or a training script. Information
findings (idle units, a dead phase that recovered) never fail it; the JSON
keeps every finding with its severity whatever the gate.
Names in ``report``'s output are plain text (``grep 'dense_0,'`` finds them)
with control and bidirectional characters escaped visibly (``\\u202e``).

TensorFlow is imported lazily, and quietly (see ``_quiet_tensorflow``): its
start-up log lines are not this program's output.
"""

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import socket
import sys
import tempfile
import time
import unicodedata

EXIT_HEALTHY, EXIT_FINDINGS, EXIT_ERROR, EXIT_PIPE_CLOSED = 0, 1, 2, 141  # 141: SIGPIPE's status in a shell
# What --fail-on accepts: the least severe finding that fails the report.
FAIL_ON = ("error", "warning", "never")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tb-gradcheck", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train two small runs on the CPU and open them in TensorBoard")
    demo.add_argument("--logdir", help="where to write the runs (default: a new temporary directory)")
    demo.add_argument("--steps", type=_positive, default=1000, help="training steps per run (default 1000)")
    demo.add_argument("--port", type=_port, default=6006, help="TensorBoard port (default 6006)")
    demo.add_argument("--host", default="localhost", help="TensorBoard host (default localhost)")
    demo.add_argument("--no-serve", action="store_true", help="write the runs and exit without starting TensorBoard")
    demo.add_argument(
        "--no-browser", action="store_true", help="print the tab's URL without opening it in the desktop's browser"
    )
    demo.add_argument(
        "--framework",
        choices=("auto", "tensorflow", "torch"),
        default="auto",
        help="train with TensorFlow or PyTorch (default: TensorFlow if installed, else PyTorch)",
    )
    demo.set_defaults(func=_demo)

    report = sub.add_parser("report", help="print findings (vanishing, exploding, dead, non-finite, check failures)")
    report.add_argument("logdir", help="the log directory TensorBoard would read")
    report.add_argument("--run", help="only this run (default: every run with gradient data)")
    report.add_argument("--format", choices=("text", "json"), default="text")
    report.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default="error",
        help="exit 1 when a finding is this severe or more: error (default), warning (warnings and errors), never",
    )
    report.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
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
    _quiet_tensorflow()
    try:
        return args.func(args)
    except _UsageError as e:
        print(f"tb-gradcheck {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # the reader went away: stop quietly; stdout to /dev/null, or the exit flush raises
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED


# What writes gradient data, for the hint of an empty log directory.
WRITERS = (
    "write some with tb_gradcheck.GradientWriter (TensorFlow), tb_gradcheck.torch.GradientWriter (PyTorch), "
    "tb_gradcheck.jax.monitor and GradientWriter (JAX), or the GradientCallback of tb_gradcheck.keras, "
    "tb_gradcheck.lightning or tb_gradcheck.transformers"
)


class _UsageError(Exception):
    pass


def _open_store(logdir):
    from tb_gradcheck.reader import store

    if os.path.isfile(logdir):
        raise _UsageError(
            f"{logdir!r} is a file; expected the log directory that holds the runs (the --logdir you give tensorboard)"
        )
    if not os.path.isdir(logdir):
        raise _UsageError(f"no such log directory: {logdir!r}")
    s, ctx, eid = store.local_store(logdir)
    runs = s.runs(ctx, eid)
    if not runs:
        raise _UsageError(f"no gradient data under {logdir!r}; {WRITERS}")
    return s, ctx, eid, runs


def _thresholds(pairs):
    from tb_gradcheck.findings import diagnose

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
    from tb_gradcheck.reader import queries

    thresholds = _thresholds(args.threshold)
    s, ctx, eid, runs = _open_store(args.logdir)
    names = sorted(runs) if args.run is None else [args.run]
    found = {}
    problems = {}
    for run in names:
        try:
            found[run] = [_plain_finding(f) for f in queries.findings(s, ctx, eid, run, thresholds)]
        except queries.NotFound as e:
            raise _UsageError(f"{e}; runs with gradient data: {sorted(runs)}") from None
        problems[run] = [p.to_dict() for p in runs[run].problems]
    problem = ("error", "warning")
    healthy = not any(f["severity"] in problem for fs in found.values() for f in fs)
    failing = problem[: problem.index(args.fail_on) + 1] if args.fail_on != "never" else ()
    failed = any(f["severity"] in failing for fs in found.values() for f in fs)
    if args.format == "json":
        body = {
            "logdir": args.logdir,
            # No finding of warning or error severity (information does not count).
            "healthy": healthy,
            "fail_on": args.fail_on,
            "failed": failed,
            "runs": {run: {"findings": fs, "problems": problems[run]} for run, fs in found.items()},
        }
        # Names stay exact in the JSON data; in its text, control and
        # bidirectional characters are JSON escapes, so a terminal or a diff
        # shows them instead of obeying them.
        print(_visible(json.dumps(body, indent=2, default=_json_default, ensure_ascii=False), json_escape=True))
    else:
        for run, fs in found.items():
            count = sum(f["severity"] in problem for f in fs)
            notes = len(fs) - count
            print(
                f"run {_visible(run)}: "
                + ("healthy" if not count else f"{count} finding{'s' if count > 1 else ''}")
                + (f" ({notes} for information)" if notes else "")
            )
            for f in fs:
                _print_finding(f, "  ")
            for p in problems[run]:
                print(f"  unreadable tag {_visible(p['tag'])}: {_visible(p['reason'])}")
    return EXIT_FINDINGS if failed else EXIT_HEALTHY


def _print_finding(f, indent):
    print(f"{indent}{f['severity'].upper():7} {f['kind']:13} steps {f['steps'][0]}-{f['steps'][1]}")
    print(f"{indent}  {_visible(f['message'])}")
    for layer, numbers in f["evidence"].items():
        shown = f.get("labels", {}).get(layer, layer)
        print(f"{indent}  - {_visible(shown)}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in numbers.items()))
    for c in f.get("consequences", []):
        print(f"{indent}  which explains:")
        _print_finding(c, indent + "    ")


def _plain_finding(finding):
    """A finding as a dict whose message names layers plainly, without the tab's bidi isolates.

    The tab's messages wrap every name in FSI ... PDI (U+2068, U+2069) so a
    sentence survives a right-to-left override in a name; in a terminal and
    in JSON those invisible marks break ``grep``. The report asks diagnose
    for plain names and escapes such characters visibly instead (``_visible``).
    """
    from tb_gradcheck.findings import diagnose

    plain = dict(finding.to_dict(), message=diagnose.describe(finding, str))
    plain["consequences"] = [_plain_finding(c) for c in finding.consequences]
    return plain


# Characters that change how the text around them is shown, or are not
# shown at all: controls (Cc), format characters including every bidi
# override, embedding, isolate and mark (Cf), line and paragraph separators.
_INVISIBLE = ("Cc", "Cf", "Zl", "Zp")


def _visible(text, json_escape=False):
    """``text`` with control and bidirectional characters written as ``\\uXXXX`` escapes.

    Args:
      text: A string.
      json_escape: Bool, default False. True when ``text`` is JSON: the
        escapes are then JSON escapes (surrogate pairs beyond U+FFFF) of
        characters that can only occur inside its strings, so the JSON
        still parses to the same names. Newlines between JSON tokens stay.
    """
    out = []
    for ch in text:
        if unicodedata.category(ch) not in _INVISIBLE or (json_escape and ch == "\n"):
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        elif json_escape:
            high, low = divmod(ord(ch) - 0x10000, 0x400)
            out.append(f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


def _export(args):
    from tb_gradcheck.reader import export
    from tb_gradcheck.reader import queries

    s, ctx, eid, runs = _open_store(args.logdir)
    try:
        heat = queries.heatmap(s, ctx, eid, args.run, args.metric, args.granularity, args.aggregate)
    except (queries.NotFound, queries.BadRequest) as e:
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

    if not args.no_serve:
        # Before training: a busy port found after minutes of training
        # would throw the runs' TensorBoard away.
        _check_port(args.host, args.port)
    logdir = args.logdir or tempfile.mkdtemp(prefix="tb_gradcheck_demo_")
    started = time.time()
    framework = demo.framework() if args.framework == "auto" else args.framework
    runs = demo.write_runs(logdir, steps=args.steps, framework=framework)
    print(
        f"Wrote {len(runs)} runs to {logdir} in {time.time() - started:.1f} s: {', '.join(os.path.basename(r) for r in runs)}"
    )
    if args.no_serve:
        return 0
    from tensorboard import program

    tb = program.TensorBoard()
    tb.configure(argv=[None, "--logdir", logdir, "--host", args.host, "--port", str(args.port)])
    try:
        url = tb.launch()
    except program.TensorBoardPortInUseError:
        # Taken between the check and now: the runs are written, say where.
        raise _UsageError(f"{_port_in_use(args.host, args.port)}; the runs are in {logdir}") from None
    print(f"Gradients tab: {url}#gradients")
    print("Press Ctrl-C to stop.")
    sys.stdout.flush()
    if not args.no_browser:
        _open_in_browser(f"{url}#gradients")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


def _open_in_browser(url):
    """Opens ``url`` in the desktop's browser, where there is a desktop; never in a console browser.

    On a Linux machine without a display, Python's ``webbrowser`` would pick
    a text browser (``www-browser``, ``lynx``) that takes over the terminal
    TensorBoard is printing to, so there the URL printed above is all.
    """
    import webbrowser

    desktop = sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    if not desktop:
        return
    with contextlib.suppress(webbrowser.Error):  # the URL is printed
        webbrowser.open(url)


def _check_port(host, port):
    """Raises ``_UsageError`` naming ``--port`` if TensorBoard could not listen on ``host:port``."""
    if port == 0:  # TensorBoard picks a free one
        return
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise _UsageError(f"cannot resolve --host {host!r}: {e.strerror}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            # As a server binds: a port left in TIME_WAIT by a closed server is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise _UsageError(_port_in_use(host, port)) from None
                if e.errno != errno.EADDRNOTAVAIL:  # e.g. no IPv6 on this machine: TensorBoard skips it too
                    raise _UsageError(
                        f"cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host"
                    ) from None


def _port_in_use(host, port):
    return f"port {port} on {host} is already in use; choose another with --port"


def _quiet_tensorflow():
    """Imports TensorFlow, if installed, without its start-up log lines on stderr.

    TensorFlow's C++ side prints its oneDNN and CPU-feature notices while it
    is imported, before any logging setting is read, whatever
    TF_CPP_MIN_LOG_LEVEL says; TensorBoard's reader imports TensorFlow too
    when it is installed. So the import runs here, first, with file
    descriptor 2 sent to a temporary file, which is replayed if the import
    fails. Later warnings and errors still reach stderr.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        return
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.get_logger().setLevel("ERROR")
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _port(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}")
    return value


if __name__ == "__main__":
    sys.exit(main())
