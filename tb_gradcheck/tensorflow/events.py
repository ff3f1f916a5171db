"""Summary events of the stored layout: full metadata once per tag, and the header row's write counter.

TensorBoard keeps the first metadata it sees for a (run, tag), so the full
layout (with row names) rides on the first event of each tag a writer
writes; later events carry only the plugin name and data class. Which tag is
fresh, and how many steps were written, live in host variables
(``distributed.host_variable``), so a traced step keeps them without retracing.
"""

import tensorflow as tf

from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import tags
from tb_gradcheck.tensorflow import distributed


class Events:
    """The tags one writer writes, each with its fresh flag, and its count of written steps.

    Attributes:
      fresh: ``{layout tag: int64 variable}``: the span whose tag was last
        written with the full metadata, -1 before the first write.
      writes: float32 variable: distinct steps written so far (None before
        the first stats write).
    """

    def __init__(self):
        self.fresh = {}
        self.writes = None
        self._last_step = None  # int64 variable: the step of the latest stats write

    def stats(self, content, layer, variable, step):
        """Writes one stats tensor: ``layer`` and ``variable`` ``[A, R, C]`` and the header row of writes so far."""
        if self.writes is None:
            self.writes = distributed.host_variable(0.0, tf.float32, "tb_gradcheck_writes")
            self._last_step = distributed.host_variable(-1, tf.int64, "tb_gradcheck_step")
        # Count steps, not calls: two models written through one writer (a
        # GAN's generator and discriminator) write twice per step, and a
        # count of calls would make the tab say "N of 2N steps" (sampled).
        step = tf.cast(step, tf.int64)
        writes = self.writes.assign_add(tf.cast(tf.not_equal(step, self._last_step), tf.float32))
        self._last_step.assign(step)
        # float32 counts exactly up to 2**24 (16.7 million) writes.
        header = tf.pad(tf.fill([tf.shape(layer)[0], 1, 1], writes), [[0, 0], [0, 0], [0, layer.shape[-1] - 1]])
        self.tensor(content, tf.concat([layer, variable, header], axis=1), step)

    def tensor(self, content, tensor, step):
        """Writes one tensor under its layout's tag for ``step``; full metadata on the tag's first write only.

        A stats layout's tag ends in the span of ``step``
        (``tags.tag_for``), computed here in the graph from the step
        tensor, as ``tag_for`` formats it. Each span tag is a new tag to
        TensorBoard, which learns the plugin and the layout from its first
        event: the full metadata goes with the first write of each span,
        i.e. whenever the span differs from the one last written with it.
        """
        base = tags.tag_for(content)
        if base not in self.fresh:
            # The span last written with the full metadata (-1: none yet).
            self.fresh[base] = distributed.host_variable(-1, tf.int64, "tb_gradcheck_span")
        written_span = self.fresh[base]
        if content["kind"] == metadata.KIND_STATS:
            span = tf.math.floordiv(tf.cast(step, tf.int64), tags.span_steps(content))
            tag = base + "/" + tf.strings.as_string(span, width=tags.SPAN_DIGITS, fill="0")
        else:
            span, tag = tf.constant(0, tf.int64), base
        fresh = tf.not_equal(span, written_span)
        md = tf.where(fresh, eventlog.metadata_bytes(content), eventlog.SLIM_METADATA)
        written = tf.summary.write(tag, tensor, step=step, metadata=md)
        # Under tf.summary.record_if(False) nothing was written: stay fresh.
        written_span.assign(tf.where(written, span, written_span))
