"""core/run_directory.py: a run directory made and checked when a writer is built, and said once where it goes."""

import logging
import os
import subprocess
import sys

import pytest

from tb_gradcheck.core import run_directory


def test_prepare_makes_missing_parents_and_writes_nothing_else(tmp_path):
    path = run_directory.prepare(tmp_path / "a" / "b" / "run", "logdir", "W")
    assert path == str(tmp_path / "a" / "b" / "run") and os.path.isdir(path)
    assert os.listdir(path) == []  # the event file comes with the first write


@pytest.mark.parametrize(
    "where, reason",
    [
        (lambda tmp: tmp / "file", "it is a file, not a directory"),
        (lambda tmp: tmp / "file" / "run", "it cannot be created \\(Not a directory\\)"),
        (lambda tmp: "/proc/tb_gradcheck_run", "it cannot be created \\(No such file or directory\\)"),
    ],
    ids=["a file", "under a file", "in /proc"],
)
def test_prepare_refuses_what_cannot_hold_a_run_in_one_sentence(tmp_path, where, reason):
    (tmp_path / "file").write_text("not a directory")
    path = str(where(tmp_path))
    message = f"Expected `logdir` to be a directory tb_gradcheck.torch.GradientWriter can write its run to. Received: {path!r}: {reason}$"
    with pytest.raises(ValueError, match=message):
        run_directory.prepare(path, "logdir", "tb_gradcheck.torch.GradientWriter")
    assert (tmp_path / "file").read_text() == "not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any directory")
def test_prepare_refuses_a_directory_it_cannot_write(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ValueError, match="it is not writable"):
        run_directory.prepare(locked, "logdir", "W")


def test_prepare_refuses_what_is_not_a_path():
    with pytest.raises(TypeError, match="Expected `logdir` to be a path. Received: int"):
        run_directory.prepare(3, "logdir", "W")


def test_announce_says_where_once_per_run_and_how_to_view_it(tmp_path):
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    run_directory.logger.addHandler(handler)
    level = run_directory.logger.level
    run_directory.logger.setLevel(logging.INFO)  # pytest configured logging before the import: no default level
    try:
        run = str(tmp_path / "logs" / "run1")
        run_directory.announce(run)
        run_directory.announce(run)  # a second writer of the same run says nothing more
        run_directory.announce(str(tmp_path / "logs" / "run2"))
    finally:
        run_directory.logger.removeHandler(handler)
        run_directory.logger.setLevel(level)
    assert lines == [
        f"tb_gradcheck: writing gradient statistics to {run} (to view: tensorboard --logdir {tmp_path / 'logs'})",
        f"tb_gradcheck: writing gradient statistics to {tmp_path / 'logs' / 'run2'} "
        f"(to view: tensorboard --logdir {tmp_path / 'logs'})",
    ]


def test_the_line_shows_by_default_and_yields_to_a_program_that_set_up_logging(tmp_path):
    say = "from tb_gradcheck.core import run_directory; run_directory.announce('logs/run1')"
    shown = subprocess.run([sys.executable, "-c", say], capture_output=True, text=True, cwd=tmp_path)
    assert (
        shown.stderr == "tb_gradcheck: writing gradient statistics to logs/run1 (to view: tensorboard --logdir logs)\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", "import logging; logging.basicConfig(level=logging.WARNING); " + say],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_prepare_from_many_processes_at_once_leaves_one_directory(tmp_path):
    # Every rank of a distributed job builds its writer on one path at the same moment.
    path = tmp_path / "a" / "run"
    code = "import sys; from tb_gradcheck.core import run_directory; run_directory.prepare(sys.argv[1], 'logdir', 'W')"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE) for _ in range(8)]
    errors = [p.communicate()[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, errors
    assert os.listdir(path) == []  # made once, the probes gone
