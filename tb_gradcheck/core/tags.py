"""Every tag's name: a layout's fingerprint, and the span of steps a stats tag holds; no TensorFlow."""

import hashlib

from tb_gradcheck.core import metadata

# A stats layout's points go to one tag per span of steps, ``<tag>/<k>`` for
# the steps ``[k * span_steps, (k + 1) * span_steps)``. TensorBoard's data
# provider has no read of "the steps after s": each read of a tag sends all of
# its points, so a tag that grew for the whole run made every poll of a live
# run re-send the run (2,000 rows x 10,000 steps: 7 s through the Rust data
# server, docs/benchmarks.md). A span is sized by bytes, not steps: what a
# poll re-sends is at most one span per layout, about SPAN_BYTES (the Rust
# server hands over about 130 MB/s here, so about 30 ms a layout), whatever
# the layout's rows. Smaller spans would mean more tags, and every tag costs
# a line of each listing and a read at a first look; a span of at least
# MIN_SPAN_WRITES writes keeps a layout of huge points from writing a tag per
# step. The span is a function of the step (not a counter), so a resumed or
# restarted run writes each step to the tag it would have had anyway.
SPAN_BYTES = 4 << 20
MIN_SPAN_WRITES = 10
# The span number in a tag is zero-padded, so TensorBoard's tag lists (sorted
# as text) list the spans of a layout in step order up to step 10**6 spans.
SPAN_DIGITS = 6


def tag_for(content, step=None):
    """Returns the tag under which tensors of this layout are written at ``step``.

    ``gradients/stats/<fingerprint>/<span>`` or
    ``gradients/check/<granularity>/<fingerprint>``: the fingerprint is the
    first 12 hex digits of the SHA-256 of the encoded layout, so a restarted
    run with the same model continues the same series, and a run written by
    a different model starts a new one that the plugin merges by row name.
    The span is ``step // span_steps(content)``, zero-padded to
    ``SPAN_DIGITS``. Check tags are small and written rarely: one tag.

    Args:
      content: The layout.
      step: Int, the step written; None gives the layout's tag without a
        span (what writers before spans wrote, and what the spans of a
        layout share: ``span_of``).
    """
    fingerprint = hashlib.sha256(metadata.encode(content)).hexdigest()[:12]
    parts = [metadata.PLUGIN_NAME, content["kind"]]
    if "granularity" in content:
        parts.append(content["granularity"])
    parts.append(fingerprint)
    return with_span("/".join(parts), content, step)


def with_span(tag, content, step):
    """``tag_for(content, step)`` from ``tag = tag_for(content)``, without encoding the layout again."""
    if step is None or content["kind"] != metadata.KIND_STATS:
        return tag
    return f"{tag}/{int(step) // span_steps(content):0{SPAN_DIGITS}d}"


def span_steps(content):
    """Steps one span tag of a stats layout holds: ``SPAN_BYTES`` of written points, times the layout's window."""
    writes = max(MIN_SPAN_WRITES, SPAN_BYTES // metadata.point_bytes(content))
    return writes * int(content.get("window", 1))


def span_of(tag):
    """``(layout tag, span)`` of a tag: the tag without its span and the span as an int, or ``(tag, None)``.

    The spans of one layout share the layout tag (``tag_for(content)``); a
    tag written before spans existed has none. Only a stats tag ending in
    ``/<digits>`` has a span: ``gradients/stats/<fingerprint>`` has three
    parts, a span tag four.
    """
    parts = tag.split("/")
    if len(parts) == 4 and parts[1] == metadata.KIND_STATS and parts[3].isdigit() and parts[3].isascii():
        return "/".join(parts[:3]), int(parts[3])
    return tag, None
