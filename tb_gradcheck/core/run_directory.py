"""A writer's run directory: made and checked when the writer is built, and announced once, in one line.

A directory that cannot hold the run (a parent that does not exist and
cannot be made, a file in the way, no permission, a read-only file system)
is refused when the writer or callback is built, in one sentence that names
it and the path, instead of failing at the first optimizer step from deep
inside TensorBoard's event writer. The directory is made then, as
``torch.utils.tensorboard.SummaryWriter`` makes its own; nothing is written
in it before the first write (no event file: a worker that never writes, a
fit refused before its first step leave an empty directory at most).

Where the run goes is said once per run directory and process, as
Lightning says where it logs: through the package's logger
(``logging.getLogger("tb_gradcheck")``), which shows INFO on stderr unless
the program has configured logging itself; a trainer's callback says it
through the trainer's own logger first (``announced``).

The steps written to a run directory are followed per process too: a step
below one written there before hides the earlier points in TensorBoard, and
is warned once (``step_written``, ``starts_again``). At a process's first
write to a run, the gradient steps other processes left there are read
(``earlier_steps``): a job resumed from a checkpoint writes some again, and
is told once which of the earlier points TensorBoard now drops
(``resumed``), at INFO; a run started again at or before the earlier first
step hides all of them, and is warned.
"""

import logging
import os
import tempfile
import warnings

from tb_gradcheck.core import earlier_steps
from tb_gradcheck.core import validate

logger = logging.getLogger("tb_gradcheck")
if not logging.getLogger().hasHandlers():
    # As Lightning does for its own logger: shown by default, and not twice once the program sets up logging.
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler())
    logger.propagate = False

_announced = set()
# What TensorBoard's loaders do with a step written again, said by both warnings about it.
_TENSORBOARD_KEEPS = (
    "TensorBoard keeps, of a step written again, the later point and drops every point at a step after it "
    "(its rule for a job restarted from a checkpoint)"
)
_last_steps = {}  # a run directory (absolute path) -> the last step this process wrote there
_rewound = set()  # the run directories whose steps went back, said once each
_scanned = set()  # the run directories whose earlier processes' steps were read (at this process's first write)
_own_files = set()  # the event files this process opened (``own_file``): not an earlier process's


def prepare(value, name, owner):
    """``value``, a run directory ``owner`` can write, made if missing.

    Args:
      value: The path (str, bytes or ``os.PathLike``).
      name: The argument's name, for the message (``logdir``).
      owner: What writes there, for the message (``tb_gradcheck.torch.GradientWriter``).

    Returns:
      The path as a ``str``.

    Raises:
      TypeError: ``value`` is not a path.
      ValueError: The directory cannot be made or written.
    """
    path = validate.path(value, name)
    if os.path.exists(path) and not os.path.isdir(path):
        reason = "it is a file, not a directory"
    else:
        try:
            # exist_ok: the processes of a distributed job make one path at once.
            os.makedirs(path, exist_ok=True)
            reason = None if _writable(path) else "it is not writable"
        except OSError as e:
            reason = f"it cannot be created ({e.strerror or e})"
    if reason is not None:
        raise ValueError(
            f"Expected `{name}` to be a directory {owner} can write its run to. Received: {path!r}: {reason}"
        )
    return path


def _writable(path):
    """Whether ``path`` takes a new entry, asked of the file system itself; nothing left there.

    Permission bits say nothing to root, nor about a read-only mount: a
    directory of a unique name (unique, so that processes checking one path
    at once never remove each other's) is made there and removed.
    """
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tb_gradcheck_", dir=path))
    except OSError:
        return False
    return True


def announced(path):
    """Whether the run ``path`` was announced in this process; marks it announced (for a trainer's own logger)."""
    key = os.path.abspath(path)
    seen = key in _announced
    _announced.add(key)
    return seen


def message(path):
    """The line that says where a run goes and how to look at it."""
    parent = os.path.dirname(os.path.normpath(path)) or "."
    return f"tb_gradcheck: writing gradient statistics to {path} (to view: tensorboard --logdir {parent})"


def announce(path):
    """Logs ``message(path)`` at INFO, once per run directory and process."""
    if not announced(path):
        logger.info(message(path))


def rewound(path, first, last):
    """The warning for a write at step ``first`` into the run ``path`` after step ``last`` (``first <= last``)."""
    return (
        f"tb_gradcheck: the steps written to {path} went back, to {first} after {last}. {_TENSORBOARD_KEEPS}, so "
        f"steps {first}-{last} written before are hidden in the Gradients tab. Expected "
        "steps that keep growing: a global step, not a batch's index in its epoch; a second fit with a new "
        "optimizer (compile() after unfreezing layers) starts at step 1 again, so give it a log_dir of its own."
    )


def _warn_rewound(path, first, last):
    key = os.path.abspath(path)
    if key not in _rewound:
        _rewound.add(key)
        warnings.warn(rewound(path, first, last), stacklevel=4)


def own_file(path):
    """Notes an event file this process writes, which ``resuming`` does not take for an earlier process's."""
    _own_files.add(os.path.abspath(path))


def resumed(path, step, earlier):
    """``(level, message)`` for a process whose first write to ``path`` is at ``step``, or None.

    Args:
      path: The run directory.
      step: This process's first written step.
      earlier: ``(first, last)`` gradient steps other processes wrote there
        (``earlier_steps.scan``), or None.
    """
    if earlier is None or step > earlier[1]:
        return None  # nothing written there at or after this step: nothing is hidden
    first, last = earlier
    if step <= first:
        return logging.WARNING, (
            f"tb_gradcheck: {path} already holds gradient steps {first}-{last} written by an earlier process, and "
            f"this process starts at step {step}. {_TENSORBOARD_KEEPS}, so all of the earlier points are hidden in "
            "the Gradients tab (they stay in the files). If this is a new training, "
            "give it a run directory of its own."
        )
    hidden = f"step {step}" if step == last else f"steps {step}-{last}"
    return logging.INFO, (
        f"tb_gradcheck: resuming the run {path}: it holds gradient steps {first}-{last} written by an earlier "
        f"process, and this process writes from step {step}. TensorBoard shows this process's points from step "
        f"{step} on and drops the earlier process's {hidden} (its rule for a job restarted from a checkpoint)."
    )


def resuming(path, step):
    """At this process's first write to the run ``path`` (at ``step``): says what an earlier process left there.

    Once per run directory and process; nothing for a remote path
    (``gs://...``), whose files are not listed here. A warning when every
    earlier point is hidden, else an INFO line (``resumed``).
    """
    key = os.path.abspath(path)
    if key in _scanned or "://" in os.fspath(path):
        return
    _scanned.add(key)
    said = resumed(path, int(step), earlier_steps.scan(key, skip=_own_files))
    if said is None:
        return
    level, text = said
    if level == logging.WARNING:
        warnings.warn(text, stacklevel=4)
    else:
        logger.info(text)


def step_written(path, step):
    """Notes that ``step`` was written to the run ``path`` by this process; warns if the run's steps went back.

    Warned once per run directory and process (``rewound``). A step
    written twice in a row (two models through one writer) is not a rewind.
    The first write also reads what earlier processes wrote there (``resuming``).
    """
    key, step = os.path.abspath(path), int(step)
    last = _last_steps.get(key)
    if last is None:
        resuming(path, step)
    if last is not None and step < last:
        _warn_rewound(path, step, last)
    _last_steps[key] = step


def starts_again(path, step):
    """For a fit whose optimizer is new (its first step is 1): warns if this process wrote ``path`` up to ``step`` or later.

    Args:
      path: The run directory.
      step: The fit's first step.
    """
    last = _last_steps.get(os.path.abspath(path))
    if last is not None and step <= last:
        _warn_rewound(path, step, last)


def reached(path, step):
    """Notes that this process's steps in the run ``path`` reached ``step`` (steps written where no host sees them)."""
    key = os.path.abspath(path)
    _last_steps[key] = max(_last_steps.get(key, step), int(step))
