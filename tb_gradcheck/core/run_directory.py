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
"""

import logging
import os
import tempfile

from tb_gradcheck.core import validate

logger = logging.getLogger("tb_gradcheck")
if not logging.getLogger().hasHandlers():
    # As Lightning does for its own logger: shown by default, and not twice once the program sets up logging.
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.StreamHandler())
    logger.propagate = False

_announced = set()


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
