"""Shared measuring helpers: interleaved repeats, medians, result rows."""

import os
import pathlib
import random
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def interleaved(candidates, repeats, inner):
    """Times each candidate ``repeats`` times, interleaved (A B C, C A B, ...).

    Interleaving spreads a noisy neighbour's load over every candidate instead
    of landing on whichever ran while it was busy, and the order is shuffled
    each round (with a fixed seed) because the candidate that runs right after
    the heaviest one was measured slower on these machines; the median drops
    the rounds that were hit hardest.

    Args:
      candidates: ``{name: zero-argument callable}``, already warmed up.
      repeats: Rounds.
      inner: Calls per timing (amortises timer overhead for fast steps).

    Returns:
      ``{name: median seconds per call}``.
    """
    samples = {name: [] for name in candidates}
    order = list(candidates)
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name in order:
            fn = candidates[name]
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - start) / inner)
    return {name: statistics.median(s) for name, s in samples.items()}


def row(name, baseline, value, unit, target=None, lower_is_better=True, limit=None):
    """One result: ``value`` against ``baseline`` measured in the same run.

    Args:
      name: What was measured.
      baseline: The baseline's figure (same unit).
      value: This figure.
      unit: Unit of both figures.
      target: The ratio the issue asks for, or None.
      lower_is_better: Whether the ratio should be at most (True) or at least (False) ``target``.
      limit: An absolute bound on ``value`` the issue asks for (e.g. 250 ms), or None.
    """
    ratio = value / baseline if baseline else float("nan")
    met = None
    if target is not None:
        met = ratio <= target if lower_is_better else ratio >= target
    if limit is not None:
        met = (met is not False) and (value <= limit if lower_is_better else value >= limit)
    return {
        "name": name,
        "baseline": baseline,
        "value": value,
        "ratio": ratio,
        "unit": unit,
        "target": target,
        "limit": limit,
        "lower_is_better": lower_is_better,
        "met": met,
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorboard_command():
    """The ``tensorboard`` of the Python running this: its script beside the interpreter, else ``-m``.

    Not whatever ``tensorboard`` comes first on PATH: CI runs from a virtual
    environment it never activates, and another install would import
    another tb_gradcheck.
    """
    script = pathlib.Path(sys.executable).parent / "tensorboard"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "tensorboard.main"]


def launch_tensorboard(logdir, extra_flags=()):
    """Starts a real `tensorboard` on 127.0.0.1 that imports this checkout's tb_gradcheck.

    Returns ``(process, base_url)`` at once; callers wait in their own way
    (some of them time the wait).
    """
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(
        [*tensorboard_command(), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port), *extra_flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    return proc, f"http://127.0.0.1:{port}"


def skipped(name, reason):
    """A row for a measurement that could not run here, saying why (no figures, no target)."""
    return {"name": f"{name}: skipped, {reason}", "unit": "", "met": None}
