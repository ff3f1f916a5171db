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
