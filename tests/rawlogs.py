"""Hand-made event files for the failure tests: summaries under plugin ``gradients`` that are wrong on purpose.

Everything here is written by TensorFlow's own summary ops (``tf.summary.write``
with a hand-built ``SummaryMetadata``), so TensorBoard reads these files
exactly as it would read a buggy, future or damaged writer's files.
"""

import glob
import json

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.core import tags

# The statistic columns of a layout written every step (stats_content's default).
C = len(metadata.stored_columns(1))


def md_bytes(content, plugin_name=metadata.PLUGIN_NAME):
    """A serialized SummaryMetadata with ``content`` (dict -> canonical JSON, bytes as they are)."""
    from tensorboard.compat.proto import summary_pb2

    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = plugin_name
    md.plugin_data.content = content if isinstance(content, bytes) else metadata.encode(content)
    md.data_class = summary_pb2.DATA_CLASS_TENSOR
    return md.SerializeToString()


def write_raw(run_dir, points, tag=None, content=None):
    """Writes ``points`` (``[(step, array)]``) under one tag with the given metadata content.

    ``tag`` defaults to the tag GradientWriter would use for ``content``.
    """
    import tensorflow as tf

    if tag is None:
        tag = tags.tag_for(content)
    writer = tf.summary.create_file_writer(str(run_dir))
    with writer.as_default():
        for i, (step, value) in enumerate(points):
            md = md_bytes(content) if i == 0 else md_bytes(b"")
            tf.summary.write(tag, tf.constant(value), step=step, metadata=md)
    writer.close()
    return tag


def stats_content(rows, window=1, aggregates=None, variables=None, **extra):
    """A stats layout (both granularities, as GradientWriter writes) with ``extra`` keys replaced."""
    aggregates = aggregates or (metadata.SINGLE_STEP_AGGREGATES if window == 1 else metadata.AGGREGATES)
    variables = list(rows) if variables is None else variables
    content = metadata.stats_layout(
        {"rows": list(rows), "sizes": [1] * len(rows)},
        {"rows": variables, "sizes": [1] * len(variables)},
        aggregates,
        window,
    )
    content.update(extra)
    return content


def stats_points(n_rows, steps, value=1.0, n_aggregates=1, n_variables=None, count=None, window=1):
    """Stats tensors for ``n_rows`` layers and as many variables (or ``n_variables``), plus the header row.

    Their columns are those a layout of ``window`` steps per write stores
    (``metadata.stored_columns``), as ``stats_content`` with that window names them.

    Every column is ``value``, except a healthy zero fraction and non-finite
    count of 0 (a NaN ``value`` stays NaN everywhere). The header row's
    write counter is the point's index + 1, or ``count`` when given.
    """
    n_variables = n_rows if n_variables is None else n_variables
    points = []
    for i, step in enumerate(steps):
        arr = np.full((n_aggregates, n_rows + n_variables + 1, len(metadata.stored_columns(window))), value, np.float32)
        if np.isfinite(value):
            for column in ("grad_zero_fraction", "grad_nonfinite"):
                arr[..., metadata.stored_columns(window).index(column)] = 0.0
        arr[:, -1, :] = 0.0
        arr[:, -1, 0] = i + 1 if count is None else count
        points.append((step, arr))
    return points


def event_files(run_dir):
    return sorted(glob.glob(str(run_dir / "events.out.tfevents.*")))


def good_run(run_dir, steps=5, rows=("good/a", "good/b")):
    """A small healthy run written by GradientWriter itself; every value is ``step + 1``."""
    import tensorflow as tf

    from tb_gradcheck import GradientWriter

    variables = [tf.Variable([1.0], name=r) for r in rows]
    with GradientWriter(run_dir) as writer:
        for step in range(steps):
            writer.write([tf.constant([float(step + 1)])] * len(rows), variables, step)
    return list(rows)


def json_bytes(obj):
    return json.dumps(obj).encode()
