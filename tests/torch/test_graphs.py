"""The PyTorch writer on a GPU: CUDA graph steps give the eager steps' events, bit for bit (needs a CUDA GPU).

Each test runs a graph writer and an eager twin (its graphs turned off) on
the same gradients in one loop, and compares their events as TensorBoard's
event file loader reads them. The loops change the gradients' addresses on
purpose (a parameter without a gradient, ``zero_grad(set_to_none=False)``
then ``True``, a gradient replaced), so both the replayed and the eager
steps are covered, and plant NaN and Inf.
"""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import read_events
from conftest import stats_content
from tb_gradcheck.torch import GradientWriter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.b = nn.Linear(16, 4)
        self.side = nn.Linear(16, 4)

    def forward(self, x, side=True):
        h = self.norm(torch.relu(self.a(x)))
        return self.b(h) + self.side(h) if side else self.b(h)


def _eager(writer):
    writer._graphs.capturing = False  # the twin: every step eager (no public switch: graphs are not a user choice)
    return writer


def _by_column(run_dir, granularity):
    """``[(step, {column: [A, R] array})]`` of a run's stats events."""
    columns = stats_content(run_dir)["columns"]
    return [
        (step, {c: array[:, :, i] for i, c in enumerate(columns)})
        for step, array, _ in read_events(run_dir, "stats", granularity)
    ]


def _assert_same_events(graph_dir, eager_dir):
    for granularity in ("layer", "variable"):
        graph, eager = _by_column(graph_dir, granularity), _by_column(eager_dir, granularity)
        assert [s for s, _ in graph] == [s for s, _ in eager]
        for (step, g), (_, e) in zip(graph, eager):
            for column in set(g) & set(e):
                np.testing.assert_array_equal(g[column], e[column], err_msg=f"{granularity} {step} {column}")


def test_graph_steps_write_the_eager_steps_events_cuda(tmp_path):
    torch.manual_seed(0)
    model = Branchy().cuda()
    x = torch.randn(32, 8, device="cuda")
    writers = {
        (every, kind): GradientWriter(tmp_path / f"{kind}{every}", model, every_n_steps=every)
        for every in (1, 4)
        for kind in ("graph", "eager")
    }
    for every in (1, 4):
        _eager(writers[every, "eager"])
    for step in range(26):
        set_to_none = not 9 <= step <= 16
        model.zero_grad(set_to_none=set_to_none)
        model(x, side=step != 8).pow(2).mean().backward()  # step 8: `side` has no gradient
        if step == 11:
            model.a.weight.grad[0, 0] = float("nan")  # in place: the same addresses, a replayed step
        if step == 12:
            model.b.bias.grad[1] = float("inf")
        if step == 15:
            model.a.weight.grad = model.a.weight.grad.clone()  # a new address
        for writer in writers.values():
            writer.write(step)
    for writer in writers.values():
        writer.close()
    for every in (1, 4):
        assert writers[every, "graph"]._graphs.replays > 0
        assert writers[every, "eager"]._graphs.replays == 0
        _assert_same_events(tmp_path / f"graph{every}", tmp_path / f"eager{every}")
    nonfinite = stats_content(tmp_path / "graph1")["columns"].index("grad_nonfinite")
    by_step = {s: a for s, a, _ in read_events(tmp_path / "graph1", "stats", "variable")}
    assert by_step[11][0, 0, nonfinite] == 1.0 and by_step[12][0, 0, nonfinite] == 0.0


def test_graph_steps_with_grad_scaler_and_clipping_write_the_eager_steps_events_cuda(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**20)  # overflows at first: refused steps, Inf gradients
    graph = GradientWriter(tmp_path / "graph", model, every_n_steps=3, optimizer=optimizer, scaler=scaler)
    eager = _eager(GradientWriter(tmp_path / "eager", model, every_n_steps=3, optimizer=optimizer, scaler=scaler))
    x = torch.randn(8, 16, device="cuda")
    for step in range(20):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean() * 1e3
        scaler.scale(loss).backward()
        if step % 2:
            scaler.unscale_(optimizer)
        graph.clip_grad_norm_(1.0)  # clips for both: the eager twin reads the clipped gradients too
        graph.write(step)
        eager.write(step)
        scaler.step(optimizer)
        scaler.update()
    graph.close()
    eager.close()
    assert graph._graphs.replays > 0
    _assert_same_events(tmp_path / "graph", tmp_path / "eager")
