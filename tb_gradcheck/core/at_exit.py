"""Writers still open when the interpreter exits are closed then: their last window written, their files flushed.

Every framework's writer registers here when it opens and leaves when it
closes, so a script that never calls ``close()`` loses nothing on a normal
exit. A writer that fails to close at exit (the framework may be half torn
down by then) is reported with a warning and the others are closed all the same.
"""

import atexit
import warnings
import weakref

_open = weakref.WeakSet()


def opened(writer):
    """``writer`` (anything with ``close()``) is closed at interpreter exit unless ``closed`` is called first."""
    _open.add(writer)


def closed(writer):
    """``writer`` was closed: nothing to do for it at exit."""
    _open.discard(writer)


@atexit.register
def _close_open_writers():
    for writer in list(_open):
        try:
            writer.close()
        except Exception as e:  # noqa: BLE001 - exit goes on for the other writers
            warnings.warn(f"tb_gradcheck: a {type(writer).__name__} could not be closed at exit: {e}", stacklevel=1)
