"""A writer's run directory: checked when the writer is built, and announced once, in one line.

A directory that cannot hold the run (a parent that does not exist and
cannot be made, a file in the way, no permission, a read-only file system)
is refused when the writer or callback is built, in one sentence that names
it and the path, instead of failing at the first optimizer step from deep
inside TensorBoard's event writer. Nothing is left there then: a writer
that never writes (a worker, a fit that stops before its first step) leaves
the file system as it found it; the event writer makes the directory at the
first write.

Where the run goes is said once per run directory and process, as
Lightning says where it logs: through the package's logger
(``logging.getLogger("tb_gradcheck")``), which shows INFO on stderr unless
the program has configured logging itself; a trainer's callback says it
through the trainer's own logger first (``announced``).
"""

import errno
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
    """``value``, a run directory ``owner`` can write, checked and left as found.

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
        reason = _unwritable(os.path.abspath(path))
    if reason is not None:
        raise ValueError(
            f"Expected `{name}` to be a directory {owner} can write its run to. Received: {path!r}: {reason}"
        )
    return path


def _unwritable(path):
    """Why no run directory can be made at ``path`` (absolute), or None; the file system left as found.

    The nearest directory that exists is asked by the file system itself: a
    directory of a unique name made there and removed (permission bits say
    nothing to root, nor about a read-only mount or /proc). Unique, so that
    the processes of a distributed job checking one path at once never
    remove what another made; the path's own missing directories are made by
    the event writer at the first write.
    """
    parent = path
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"it cannot be created ({os.strerror(errno.ENOTDIR)})"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tb_gradcheck_", dir=parent))
    except OSError as e:
        if os.path.exists(path):
            return "it is not writable"
        return f"it cannot be created ({e.strerror or e})"
    return None


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
