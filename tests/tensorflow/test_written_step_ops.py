"""A written step: the ops the traced graph runs beyond the bare step's, counted per variable and in all."""

import collections

import pytest

from tb_gradcheck import GradientWriter
from tests.tensorflow.test_window_ops import CONDS
from tests.tensorflow.test_window_ops import _step_graph

# Issue 46. A written step's cost on a CPU is its passes over the gradients
# and weights (docs/benchmarks.md, "The written step"): one op each, so a
# variable adds at most 7 ops: its gradient's norm (L2Loss), zero count (Sign,
# L2Loss), per-unit max |g| (Abs, Max; a bias, whose units are its elements,
# needs no Max) and its weight's norm (ReadVariableOp, L2Loss). Everything
# else is done once on all variables' stacked results, so it does not grow
# with the number of variables.
OPS_PER_VARIABLE = 7
# That fixed part, counted at 12 variables (layer rows, the rare-case conds'
# predicates, the write and its flush): 107 ops with the conds' branches taken
# at a healthy step; bounded with a little room, so that work which should
# be done once for all variables and is done per variable instead shows in
# the per-variable count, and a few dozen new ops in the fixed part show here.
FIXED_OPS = 115
# Free at run time: constants and the placeholders of captured tensors.
FREE = ("Const", "Placeholder")


def _written_step_ops(graph, bare):
    """Ops a healthy written step runs beyond ``bare``'s, by type: top level and the conds' branches it takes.

    The rare-case conds (a non-finite gradient, a sum of squares out of
    float32's band) take their else branch at a healthy step; the write's
    cond, whose then branch writes the summary, takes its then branch.
    """
    definition = graph.as_graph_def()
    library = {f.signature.name: f for f in definition.library.function}
    ran = collections.Counter(node.op for node in definition.node)
    ran.subtract(node.op for node in bare.as_graph_def().node)
    for node in definition.node:
        if node.op in CONDS:
            then = library[node.attr["then_branch"].func.name].node_def
            writes = any(n.op == "WriteSummary" for n in then)
            taken = then if writes else library[node.attr["else_branch"].func.name].node_def
            ran.update(n.op for n in taken)
    return collections.Counter({op: n for op, n in ran.items() if op not in FREE and n > 0})


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    """``{variables: ops by type}`` of a written step, MLPs with 12 and 42 variables, written every step."""
    out = {}
    for n_layers in (6, 21):
        _, bare = _step_graph(n_layers, None)
        with GradientWriter(tmp_path_factory.mktemp("run"), every_n_steps=1) as writer:
            n_variables, graph = _step_graph(n_layers, writer)
        out[n_variables] = _written_step_ops(graph, bare)
    assert sorted(out) == [12, 42]
    return out


def test_a_written_step_adds_at_most_seven_ops_per_variable_with_12_and_42_variables(counts):
    per_variable = collections.Counter(counts[42])
    per_variable.subtract(counts[12])
    assert sum(per_variable.values()) <= OPS_PER_VARIABLE * 30, dict(+per_variable)
    # The passes themselves: a norm and a zero count per gradient, a norm per weight.
    assert per_variable["L2Loss"] == 3 * 30 and per_variable["Sign"] == 30


def test_a_written_step_adds_a_fixed_number_of_ops_beside_them(counts):
    fixed = sum(counts[12].values()) - OPS_PER_VARIABLE * 12
    assert fixed <= FIXED_OPS, dict(counts[12])
