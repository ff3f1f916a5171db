"""What one run holds, as TensorBoard's data provider lists it: its series by kind and granularity; numpy only."""

import dataclasses

from tb_gradcheck.core import metadata
from tb_gradcheck.core import tags
from tb_gradcheck.reader import merge
from tb_gradcheck.reader import points


@dataclasses.dataclass
class Series:
    """One tag's layout and metadata as listed by the data provider."""

    tag: str
    content: dict
    max_step: int
    max_wall_time: float


@dataclasses.dataclass
class RunIndex:
    """What one run holds: its series by (kind, granularity), and unreadable tags."""

    run: str
    series: dict  # (kind, granularity) -> [Series], earliest written first
    problems: list

    def kinds(self):
        return {kind for kind, _ in self.series}

    def layouts(self, kind, granularity):
        return self.series.get((kind, granularity), [])

    def rows(self, kind, granularity):
        """Row names of every layout, merged by name in order of first appearance."""
        return merge.rows([s.content for s in self.layouts(kind, granularity)], granularity)

    def sparse_rows(self, granularity):
        """Rows any layout marks as having sparse (IndexedSlices) gradients."""
        return sorted(
            {
                n
                for s in self.layouts(metadata.KIND_STATS, granularity)
                for n in s.content[granularity].get("sparse_rows", [])
            }
        )

    def outside_optimizer(self, granularity):
        """Rows any layout marks as having a gradient that no parameter group of the optimizer holds."""
        return sorted(
            {
                n
                for s in self.layouts(metadata.KIND_STATS, granularity)
                for n in s.content[granularity].get("outside_optimizer", [])
            }
        )

    def not_cleared_after(self):
        """The last step written before a layout says its gradients were not cleared (-1: from the start), or None.

        The PyTorch writer marks the layouts it writes once it saw a
        ``backward()`` add into gradients the optimizer had applied
        (``gradients_not_cleared``); the layouts before it are clean.
        """
        layouts = self.layouts(metadata.KIND_STATS, "layer")
        flagged = [s.max_step for s in layouts if s.content.get("gradients_not_cleared")]
        if not flagged:
            return None
        clean = [s.max_step for s in layouts if not s.content.get("gradients_not_cleared")]
        return max((m for m in clean if m < min(flagged)), default=-1)

    def shapes(self, granularity):
        """``{row: shapes}``: each row's parameter shapes as tuples (its element count where no layout has shapes).

        With its name, what a row's kind is read from (the vanishing rule's
        ``vanishing.kinds``). The first layout that has a row decides it.
        """
        out = {}
        for s in self.layouts(metadata.KIND_STATS, granularity):
            block = s.content[granularity]
            given = block.get("shapes")
            rows = block.get("rows", [])
            values = [tuple(map(tuple, x)) for x in given] if given else [(int(n),) for n in block.get("sizes", [])]
            for name, value in zip(rows, values):
                out.setdefault(name, value)
        return out

    def labels(self, granularity):
        """``{row name: label}`` for the rows a layout names by an index (``0 (Linear)``: ``metadata.labels``)."""
        out = {}
        for s in self.layouts(metadata.KIND_STATS, granularity):
            out.update(metadata.labels(s.content[granularity]))
        return out

    def last_write(self):
        """Wall time of the run's newest point, or None: changes whenever new data arrives."""
        times = [s.max_wall_time for layouts in self.series.values() for s in layouts]
        return max(times) if times else None

    def version(self):
        """What changes whenever any tag of the run gets new points: part of a cache key."""
        return tuple(sorted((s.tag, *series_version(s)) for layouts in self.series.values() for s in layouts))

    def read_bytes(self):
        """About what reading every tag of the run again costs: a miss's cost for ``cache.Cache``."""
        by_tag = {s.tag: s for layouts in self.series.values() for s in layouts}
        return sum(points.point_bytes(s.content) * steps_held(s) for s in by_tag.values())

    def window(self):
        return max((s.content.get("window", 1) for s in self.layouts(metadata.KIND_STATS, "layer")), default=1)

    def aggregates(self):
        """Aggregates any stats layout of the run can answer, in canonical order."""
        return merge.aggregates([s.content for s in self.layouts(metadata.KIND_STATS, "layer")])


def steps_held(series):
    """About how many steps a tag holds: up to its ``max_step``, from the first of its span."""
    span = tags.span_of(series.tag)[1]
    first = 0 if span is None else span * tags.span_steps(series.content)
    return max(1, series.max_step + 1 - first)


def series_version(series):
    return series.max_step, series.max_wall_time
