"""tb_gradcheck.torch.host: written steps on their way to the host are written in step order, none lost.

On a GPU each copy's readiness is a CUDA event (tests/torch/test_graphs.py
and the ``cuda`` tests of tests/torch/test_writer.py run the real thing).
Here ``_Event`` stands in for it, so the order and the waits can be driven
step by step on a machine without a GPU.
"""

import torch

from tb_gradcheck.torch import host


class _Event:
    """A copy's completion, set by the test (``torch.cuda.Event``'s ``query`` / ``synchronize``)."""

    def __init__(self):
        self.done = False
        self.waited = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True
        self.done = True


def test_steps_are_written_in_order_waiting_only_when_bounded_or_asked():
    written = []
    flights = host.Flights(lambda pending, values: written.append((pending, float(values["x"][0]))))
    events = [_Event() for _ in range(3)]

    def copy(i):
        flat = torch.tensor([float(i)], dtype=torch.float64)
        return host.Copy(("x",), ((1,),), flat, events[i], flights.buffers)

    flights.add("step 0", copy(0))
    flights.arrive()
    assert written == []  # not there yet: nothing waits
    events[1].done = True
    flights.add("step 1", copy(1))
    flights.arrive()
    assert written == []  # step 1 is there, but step 0 is written first
    assert host.MAX_IN_FLIGHT == 2
    flights.add("step 2", copy(2))  # a third copy: the oldest is waited for, then what has arrived is written
    assert events[0].waited and not events[1].waited
    assert written == [("step 0", 0.0), ("step 1", 1.0)]
    flights.arrive(wait=len(flights))  # flush / close
    assert written[-1] == ("step 2", 2.0) and events[2].waited and len(flights) == 0


def test_values_are_read_out_of_the_buffer_before_it_is_reused():
    buffers = host.Buffers()
    flat = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    event = _Event()
    copy = host.Copy(("a", "b"), ((), (2,)), flat, event, buffers)
    event.done = True
    assert copy.ready()
    flat.fill_(-1.0)  # the buffer reused by a later copy
    values = copy.values()
    assert values["a"] == 1.0 and list(values["b"]) == [2.0, 3.0]
    assert buffers.take(3) is flat  # given back once read
