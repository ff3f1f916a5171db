"""The event files of the writers without TensorFlow, as TensorBoard's Python loader finds them."""

import itertools
import types

import numpy as np

from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata


def test_writers_opened_in_one_second_sort_in_the_order_they_were_opened(tmp_path, monkeypatch):
    """The Python loader reads a run's files in name order and skips one that sorts before the file it reads.

    A job that reopens its writer within the second (a notebook cell run
    again, a sweep of short runs into one directory) made its tenth file
    sort before its ninth: that file's steps never showed.
    """
    from tensorboard.backend.event_processing import event_accumulator

    monkeypatch.setattr(eventlog, "time", types.SimpleNamespace(time=lambda: 1_800_000_000.0))
    monkeypatch.setattr(eventlog, "_file_ids", itertools.count(8))
    content = metadata.stats_layout(
        {"rows": ["a"], "sizes": [1]}, {"rows": ["a"], "sizes": [1]}, metadata.SINGLE_STEP_AGGREGATES, 1
    )
    columns = len(metadata.stored_columns(1))
    run = tmp_path / "run"
    accumulator = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.TENSORS: 0})
    for first in (0, 5, 10):  # files 8, 9 and 10 of this process, in one second
        log = eventlog.EventLog(run)
        for step in range(first, first + 5):
            log.stats(content, np.full((1, 1, columns), step, np.float32), np.zeros((1, 1, columns)), step)
        log.close()
        accumulator.Reload()
    [tag] = accumulator.Tags()[event_accumulator.TENSORS]
    assert [event.step for event in accumulator.Tensors(tag)] == list(range(15))


def _steps_log(run):
    content = metadata.stats_layout(
        {"rows": ["a"], "sizes": [1]}, {"rows": ["a"], "sizes": [1]}, metadata.SINGLE_STEP_AGGREGATES, 1
    )
    columns = len(metadata.stored_columns(1))
    log = eventlog.EventLog(run)

    def write(step):
        log.stats(content, np.full((1, 1, columns), step, np.float32), np.zeros((1, 1, columns)), step)

    return log, write


def test_steps_that_go_back_are_warned_once_per_run(tmp_path):
    """A batch's index in its epoch as the step: each epoch rewrites the last, and TensorBoard hides the earlier.

    Warned once, at the first step that goes back, with the steps hidden; a
    step written twice in a row (two models through one writer) and a second
    writer that goes on from the first are not rewinds.
    """
    import warnings

    from tensorboard.backend.event_processing import event_accumulator

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log, write = _steps_log(tmp_path / "growing")
        for step in (0, 1, 1, 2):
            write(step)
        log.close()
        log, write = _steps_log(tmp_path / "growing")
        write(3)
        log.close()
        assert caught == []
        log, write = _steps_log(tmp_path / "epochs")
        for _epoch in range(3):
            for step in range(4):
                write(step)
        log.close()
    [warning] = [str(w.message) for w in caught]
    assert f"the steps written to {tmp_path / 'epochs'} went back, to 0 after 3" in warning
    assert "steps 0-3 written before are hidden" in warning and "not a batch's index in its epoch" in warning
    # Nothing is lost on disk: every point is in the file, for whoever reads it without TensorBoard's rule.
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path / "epochs"), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    [tag] = accumulator.Tags()[event_accumulator.TENSORS]
    assert [event.step for event in accumulator.Tensors(tag)] == [0, 1, 2, 3] * 3
