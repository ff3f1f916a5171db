"""The stored format's events, written with numpy and TensorBoard's own event writer; no TensorFlow.

Every writer that is not TensorFlow's (PyTorch, JAX) writes through
``EventLog``; TensorFlow's writes the same summaries from inside its graph
(``tb_gradcheck.tensorflow.events``) with the metadata bytes made here, so both give
the same ``Summary.Value`` bytes for the same numbers (tag, metadata,
tensor). What the tensors hold is in ``docs/stored_format.md``.

Flush policy, as for the TensorFlow writer: every ``stats`` and ``tensor``
call ends with a flush to the operating system, so a process killed with
SIGKILL loses nothing it had written (one ``write(2)`` of a few kilobytes
per written step).
"""

import itertools
import os
import socket
import threading
import time

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer import event_file_writer
from tensorboard.util import tensor_util

from tb_gradcheck.core import metadata
from tb_gradcheck.core import records
from tb_gradcheck.core import run_directory
from tb_gradcheck.core import tags


def metadata_bytes(content=None):
    """Serialised ``SummaryMetadata``: with the layout ``content`` (a tag's first event) or slim (None).

    Plugin name and ``DATA_CLASS_TENSOR`` always: without a data class
    neither of TensorBoard's loaders returns the summary at all.
    """
    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = metadata.PLUGIN_NAME
    md.data_class = summary_pb2.DATA_CLASS_TENSOR
    if content is not None:
        md.plugin_data.content = metadata.encode(content)
    return md.SerializeToString()


SLIM_METADATA = metadata_bytes()


def with_header(layer, variable, writes):
    """float32 ``[A, L + V + 1, C]``: ``layer`` and ``variable`` rows, then the header row of writes so far.

    Args:
      layer: ``[A, L, C]`` statistics of the layer rows.
      variable: ``[A, V, C]`` statistics of the variable rows.
      writes: Distinct steps this writer has written, this one included
        (the header row's column 0; exact in float32 up to 2**24).
    """
    layer = np.asarray(layer, np.float32)
    header = np.zeros((layer.shape[0], 1, layer.shape[-1]), np.float32)
    header[:, 0, 0] = writes
    return np.concatenate([layer, np.asarray(variable, np.float32), header], axis=1)


def summary_value(tag, array, md_bytes):
    """One ``Summary.Value``: the tensor as float32 with ``md_bytes`` as its metadata."""
    value = summary_pb2.Summary.Value(tag=tag)
    value.metadata.ParseFromString(md_bytes)
    value.tensor.CopyFrom(tensor_util.make_tensor_proto(np.ascontiguousarray(array, np.float32)))
    return value


class EventLog:
    """The tags of one writer, their first-event metadata, its write counter, and where events go.

    Args:
      logdir: Directory of the run; the event file is created at the first
        event (a process that never writes leaves no file).
      sink: Instead of ``logdir``, an object with ``add_event(event)`` and
        ``flush()`` (``torch.utils.tensorboard.SummaryWriter``'s
        ``file_writer``, or an ``EventFileWriter``): events go there, and
        ``close`` flushes it but does not close it.
      filename_suffix: Appended to the event file's name, so two writers of
        one process in one directory (a user's own ``SummaryWriter`` beside
        ours) never share a file.
    """

    def __init__(self, logdir=None, sink=None, filename_suffix=".gradients"):
        self._logdir = None if logdir is None else os.fspath(logdir)
        self._sink = sink
        self._owns_sink = sink is None
        self._suffix = filename_suffix
        self._fresh = {}  # layout tag -> its span tag last written with the full metadata
        self._tags = {}  # id(layout) -> (layout, its tag): a writer hands the same layout dict at every step
        self._writes = 0
        self._last_step = None
        self._lock = threading.Lock()
        self.closed = False

    def stats(self, content, layer, variable, step):
        """Writes one stats tensor (``layer`` ``[A, L, C]``, ``variable`` ``[A, V, C]``) with the header row.

        Steps, not calls, are counted for the header: two models written
        through one writer (a GAN) write twice per step.
        """
        step = int(step)
        with self._lock:
            if step != self._last_step:
                self._writes += 1
            self._last_step = step
            writes = self._writes
        if self._logdir is not None:
            run_directory.step_written(self._logdir, step)
        self.tensor(content, with_header(layer, variable, writes), step)

    def tensor(self, content, array, step):
        """Writes one tensor under its layout's tag for ``step``, full metadata on the tag's first write, then flushes.

        A stats layout's tag ends in the span of ``step`` (``tags.tag_for``).
        """
        base = self._tag(content)
        tag = tags.with_span(base, content, step)
        with self._lock:
            if self.closed:
                raise ValueError("Cannot write: this writer is closed. Create a new one to keep writing.")
            # As tb_gradcheck.tensorflow.events does in the graph: the full metadata
            # whenever the span differs from the one last written with it.
            md = SLIM_METADATA if self._fresh.get(base) == tag else metadata_bytes(content)
            self._fresh[base] = tag
            event = event_pb2.Event(step=int(step), wall_time=time.time())
            event.summary.value.append(summary_value(tag, array, md))
            sink = self._open()
            sink.add_event(event)
            sink.flush()

    def _tag(self, content):
        """``tags.tag_for(content)``, hashed once per layout object (layouts are not changed once made)."""
        held = self._tags.get(id(content))
        if held is None or held[0] is not content:
            if len(self._tags) >= 64:  # layouts made per call (a check's) are not kept forever
                self._tags.clear()
            held = self._tags[id(content)] = (content, tags.tag_for(content))
        return held[1]

    def flush(self):
        with self._lock:
            if self._sink is not None and not self.closed:
                self._sink.flush()

    def close(self):
        """Flushes, and closes the event file if this log opened it. Safe to call twice."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._sink is not None:
                self._sink.flush()
                if self._owns_sink:
                    self._sink.close()

    def _open(self):
        if self._sink is None:
            if "://" in self._logdir:  # a remote file system: through TensorBoard's gfile
                self._sink = event_file_writer.EventFileWriter(self._logdir, filename_suffix=self._suffix)
            else:
                self._sink = EventFile(self._logdir, self._suffix)
        return self._sink


_file_ids = itertools.count()


class EventFile:
    """An event file in a local directory, each event written and flushed as it comes; no TensorFlow.

    TensorBoard's ``EventFileWriter`` makes its directory and file with
    ``tensorboard.compat.tf``, which imports TensorFlow whenever it is
    installed: seconds and a few hundred megabytes in a PyTorch process that
    never uses it. This writes the same records (``records``: length,
    masked CRC-32C, data, masked CRC-32C, with a CRC that costs a small
    part of TensorBoard's Python one), under the name ``EventFileWriter``
    would give it (its counter zero-padded), and synchronously: the log
    flushes after every event anyway.
    """

    def __init__(self, logdir, filename_suffix=""):
        os.makedirs(logdir, exist_ok=True)
        # The file counter is zero-padded where TensorBoard's is not: TensorBoard's
        # Python loader reads a run's files in name order and skips a file that
        # sorts before the one it reads, so a writer opened in the same second
        # as this process's tenth (or hundredth) would be lost to it.
        name = "events.out.tfevents.%010d.%s.%s.%06d%s" % (
            time.time(),
            socket.gethostname(),
            os.getpid(),
            next(_file_ids),
            filename_suffix,
        )
        self.path = os.path.join(logdir, name)
        self._file = open(self.path, "wb")
        run_directory.own_file(self.path)
        source = event_pb2.SourceMetadata(writer="tb_gradcheck")
        self.add_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2", source_metadata=source))
        self.flush()

    def add_event(self, event):
        self._file.write(records.record(event.SerializeToString()))

    def flush(self):
        self._file.flush()

    def close(self):
        if not self._file.closed:
            self._file.close()
