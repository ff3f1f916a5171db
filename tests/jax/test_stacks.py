"""tb_gradcheck.jax: parameters stacked for ``lax.scan`` get a row per layer (slice), as if the stack were unrolled.

Real Flax Linen and NNX models, optax, ``jax.jit``; event files read back
with TensorBoard's own loader, findings through ``tb-gradcheck report``.
"""

import json
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import tb_gradcheck.jax as tj
from conftest import read_events
from conftest import stats_content
from reference_stats import reference
from tb_gradcheck import cli
from tb_gradcheck.core import metadata
from tests.jax.test_writer import by_name
from tests.jax.test_writer import feed
from tests.jax.test_writer import run_steps

# float32 reductions over a few hundred elements agree with float64 numpy to
# about 1e-6 relative; 1e-5 leaves room for summation order, nothing more.
RTOL = 1e-5
COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
DEPTH = 6


class Block(nn.Module):
    """A residual Dense + ReLU block: scanned, its parameters are ``[DEPTH, ...]`` stacks."""

    @nn.compact
    def __call__(self, x, _):
        return nn.relu(nn.Dense(16)(x)) + x, None


class Scanned(nn.Module):
    """Dense -> ``nn.scan(Block, length=DEPTH)`` -> Dense (Linen names: Dense_0, ScanBlock_0, Dense_1)."""

    reverse: bool = False

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(16)(x)
        scan = nn.scan(
            Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=DEPTH, reverse=self.reverse
        )
        x, _ = scan()(x, None)
        return nn.Dense(1)(x)


class Unrolled(nn.Module):
    """The same network with DEPTH separate blocks (``layer_i``), in the scan's order."""

    reverse: bool = False

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(16, name="inp")(x)
        blocks = [Block(name=f"layer_{i}") for i in range(DEPTH)]
        for i in reversed(range(DEPTH)) if self.reverse else range(DEPTH):
            x, _ = blocks[i](x, None)
        return nn.Dense(1, name="out")(x)


def scanned_params(reverse=False):
    """Scanned's parameters, slice 2's first 8 units dead (their bias far below zero behind the ReLU)."""
    x = data()[0]
    params = Scanned(reverse).init(jax.random.PRNGKey(0), x)
    block = params["params"]["ScanBlock_0"]["Dense_0"]
    block["bias"] = block["bias"].at[2, :8].set(-100.0)
    return params


def unrolled_params(params):
    """Scanned's parameters as Unrolled's: slice i of each stack is layer_i's."""
    p = params["params"]
    stack = p["ScanBlock_0"]["Dense_0"]
    layers = {f"layer_{i}": {"Dense_0": {k: v[i] for k, v in stack.items()}} for i in range(DEPTH)}
    return {"params": {"inp": p["Dense_0"], "out": p["Dense_1"], **layers}}


def data():
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.normal(size=(8, 8)), jnp.float32), jnp.asarray(rng.normal(size=(8, 1)), jnp.float32)


def train(model, params, logdir, steps=3, every_n_steps=1, **monitor_args):
    """Trains ``model`` with Adam inside a monitor in depth order (``depth_order``); returns each step's (grads, params, updates)."""
    x, y = data()
    order = tj.depth_order(model.apply, params, x)
    tx = tj.monitor(optax.adam(1e-2), every_n_steps=every_n_steps, order=order, **monitor_args)
    return run_steps(tx, params, lambda p: jnp.mean((model.apply(p, x) - y) ** 2), steps, logdir)


def test_depth_order_finds_the_scanned_stacks_and_their_direction():
    for reverse in (False, True):
        params = scanned_params(reverse)
        order = tj.depth_order(Scanned(reverse).apply, params, data()[0])
        assert order.stacked == {"ScanBlock_0": (reverse,)}
        assert list(order) == [
            "Dense_0/kernel",
            "Dense_0/bias",
            "ScanBlock_0/Dense_0/kernel",
            "ScanBlock_0/Dense_0/bias",
            "Dense_1/kernel",
            "Dense_1/bias",
        ]
    # Unrolled, nothing is scanned.
    params = unrolled_params(scanned_params())
    assert tj.depth_order(Unrolled().apply, params, data()[0]).stacked == {}


def test_a_whole_models_depth_order_serves_a_monitor_inside_masked_or_multi_transform(tmp_path):
    # The monitor sees the subtree optax.masked hands it; the order (and the
    # stack it found) is the whole model's. Names it lists and the monitor
    # does not see are passed over; the rows it sees keep its depth order
    # (ScanBlock_0 before Dense_1, which natural order would swap).
    params = scanned_params()
    x, y = data()
    order = tj.depth_order(Scanned().apply, params, x)
    scanned = [f"ScanBlock_0/{i}/Dense_0" for i in range(DEPTH)]
    trained = {"params": {"Dense_0": False, "ScanBlock_0": True, "Dense_1": True}}
    labels = jax.tree.map(lambda t: "train" if t else "frozen", trained)
    runs = {
        "masked": optax.masked(tj.monitor(optax.adam(1e-2), order=order), jax.tree.map(lambda t: not t, trained)),
        "multi": optax.multi_transform(
            {"train": tj.monitor(optax.adam(1e-2), order=order), "frozen": optax.set_to_zero()}, labels
        ),
    }
    expected = {"masked": ["Dense_0"], "multi": scanned + ["Dense_1"]}
    for name, tx in runs.items():
        run_steps(tx, params, lambda p: jnp.mean((Scanned().apply(p, x) - y) ** 2), 2, tmp_path / name)
        assert stats_content(tmp_path / name)["layer"]["rows"] == expected[name], name
    # An order of other names that misses names the monitor sees is another model's: refused.
    other = ["Encoder_0/kernel", "Dense_1/kernel", "Dense_1/bias"]
    with pytest.raises(ValueError, match=r"without \['ScanBlock_0/Dense_0/bias'.*unknown names \['Encoder_0/kernel'\]"):
        optax.masked(tj.monitor(order=other), trained).init(params)


class Inner(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return nn.tanh(nn.Dense(4)(x)), None


class Middle(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return nn.scan(Inner, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)()(x, None)[0], None


class Outer(nn.Module):
    """A Linen scan over a block that scans: Dense kernels ``[3, 2, 4, 4]``."""

    @nn.compact
    def __call__(self, x):
        return nn.scan(Middle, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)()(x, None)[0]


def test_rows_of_a_scan_in_a_scan_and_of_a_stack_beside_a_parameter_that_is_not():
    x = jnp.ones((2, 4))
    params = Outer().init(jax.random.PRNGKey(0), x)
    order = tj.depth_order(Outer().apply, params, x)
    assert order.stacked == {"ScanMiddle_0": (False,), "ScanMiddle_0/ScanInner_0": (False,)}
    names = tj.layout.make(params, 1, order=order, stacked=order.stacked).names
    assert names[:3] == (
        "ScanMiddle_0/0/ScanInner_0/0/Dense_0/kernel",
        "ScanMiddle_0/0/ScanInner_0/0/Dense_0/bias",
        "ScanMiddle_0/0/ScanInner_0/1/Dense_0/kernel",
    )
    assert names[-1] == "ScanMiddle_0/2/ScanInner_0/1/Dense_0/bias" and len(names) == 12

    # ``blk/a`` is scanned over, ``blk/b`` is the scan's const: ``blk`` would take b in, so a is its own prefix.
    def fn(p, h):
        b = p["blk"]["b"]
        return jax.lax.scan(lambda h, a: (jnp.tanh(h @ a @ b), None), h, p["blk"]["a"])[0]

    params = {"blk": {"a": jnp.ones((3, 4, 4)), "b": jnp.ones((4, 4))}}
    order = tj.depth_order(fn, params, x)
    assert order.stacked == {"blk/a": (False,)}
    lay = tj.layout.make(params, 1, order=order, stacked=order.stacked)
    assert lay.names == ("blk/a/0", "blk/a/1", "blk/a/2", "blk/b")
    assert lay.owners == ("blk/a/0", "blk/a/1", "blk/a/2", "blk")


def test_a_scanned_stack_gives_the_rows_of_its_unrolled_twin(tmp_path):
    params = scanned_params()
    train(Scanned(), params, tmp_path / "scanned")
    train(Unrolled(), unrolled_params(params), tmp_path / "unrolled")
    scanned, unrolled = stats_content(tmp_path / "scanned"), stats_content(tmp_path / "unrolled")
    blocks = [f"ScanBlock_0/{i}/Dense_0" for i in range(DEPTH)]
    assert scanned["layer"]["rows"] == ["Dense_0", *blocks, "Dense_1"]
    assert unrolled["layer"]["rows"] == ["inp", *[f"layer_{i}/Dense_0" for i in range(DEPTH)], "out"]
    assert scanned["variable"]["rows"][2:4] == ["ScanBlock_0/0/Dense_0/kernel", "ScanBlock_0/0/Dense_0/bias"]
    assert scanned["layer"]["shapes"] == unrolled["layer"]["shapes"]
    for granularity in ("layer", "variable"):
        a = read_events(tmp_path / "scanned", granularity=granularity)
        b = read_events(tmp_path / "unrolled", granularity=granularity)
        assert [s for s, _, _ in a] == [s for s, _, _ in b] == [0, 1, 2]
        for (_, x, _), (_, y, _) in zip(a, b):
            # The same numbers from another XLA program (a loop, not six
            # copies): float32 rounding apart, Adam's updates included.
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-9)
    (_, first, _) = read_events(tmp_path / "scanned")[0]
    dead = first[0, 1:-1, COL["dead_unit_fraction"]]
    assert dead[2] >= 0.5 and np.all(dead[[0, 1, 3, 4, 5]] < 0.5)  # the dead half of slice 2, and only there


def test_each_slice_matches_a_float64_twin_of_its_gradient_in_a_reverse_scan(tmp_path):
    seen = train(Scanned(reverse=True), scanned_params(reverse=True), tmp_path)
    content = stats_content(tmp_path)
    # Scan order: a reverse scan runs slice 5 first, so its rows come first.
    assert content["layer"]["rows"][1:-1] == [f"ScanBlock_0/{i}/Dense_0" for i in reversed(range(DEPTH))]
    layers, variables = read_events(tmp_path), read_events(tmp_path, granularity="variable")

    def sliced(tree):
        """``{row name: float64 array}``: each stacked leaf's slices under their row names."""
        out = {}
        for name, value in by_name(tree).items():
            if name.startswith("ScanBlock_0/"):
                for i in range(DEPTH):
                    out[name.replace("ScanBlock_0/", f"ScanBlock_0/{i}/")] = value[i]
            else:
                out[name] = value
        return out

    names = content["variable"]["rows"]
    units = {n: (16 if n.startswith(("Dense_0", "ScanBlock_0")) else 1) for n in names}
    groups = [[v for v in names if v.rsplit("/", 1)[0] == layer] for layer in content["layer"]["rows"]]
    base = len(metadata.stored_columns(1))
    for (grads, params, updates), (_, layer, _), (_, variable, _) in zip(seen, layers, variables):
        g, w, u = sliced(grads), sliced(params), sliced(updates)
        np.testing.assert_allclose(layer[0, :, :base], reference(g, w, units, groups), rtol=RTOL, atol=1e-12)
        expected = reference(g, w, units, [[n] for n in names])
        np.testing.assert_allclose(variable[0, :, :base], expected, rtol=RTOL, atol=1e-12)
        update = np.array([np.sqrt(np.sum(u[n] ** 2)) for n in names])
        np.testing.assert_allclose(variable[0, :, base], update, rtol=RTOL)
    dead = layers[0][1][0, 1:-1, COL["dead_unit_fraction"]]
    assert dead[DEPTH - 1 - 2] >= 0.5  # slice 2, fourth in a reverse scan's order


def stacked_grads():
    """Gradients of a stack ``blk/w [4, 3, 5]`` (and a plain ``head``) that a float32 sum of squares gets wrong, per slice."""
    rng = np.random.default_rng(2)
    w, head = rng.normal(size=(4, 3, 5)), rng.normal(size=(5, 2))
    scales = [
        [1, 1, 1, 1],
        [1e-25, 1, 1, 1],  # slice 0's squares underflow
        [1, 4e19, 1, 1e-30],  # slice 1's overflow, slice 3's underflow
        [1, 1, 1, 1],
        [0, 1, 1, 1],  # slice 0 has no gradient at all
        [3, 1, 1, 1],
    ]
    out = []
    for k, s in enumerate(scales):
        g = w * np.asarray(s, np.float64)[:, None, None]
        if k == 3:
            g[2, 1, 1] = np.nan  # slice 2 only
        out.append({"blk": {"w": jnp.asarray(g, jnp.float32)}, "head": jnp.asarray(head, jnp.float32)})
    return out


def test_slices_are_exact_at_any_scale_and_windows_hold_the_aggregates_of_every_step(tmp_path):
    seq = stacked_grads()
    feed(seq, 1, tmp_path / "every", stacked={"blk": 1})  # blk stacks one axis
    feed(seq, 3, tmp_path / "window", stacked={"blk": 1})
    assert stats_content(tmp_path / "every")["layer"]["rows"] == ["blk/0", "blk/1", "blk/2", "blk/3", "head"]
    every = {s: x for s, x, _ in read_events(tmp_path / "every")}
    columns = [COL[c] for c in ("grad_norm", "grad_max_abs", "grad_zero_fraction", "grad_nonfinite")]
    for s, g in enumerate(seq):
        named = {f"blk/{i}": np.asarray(g["blk"]["w"][i], np.float64) for i in range(4)}
        named["head"] = np.asarray(g["head"], np.float64)
        units = dict.fromkeys(named, 5) | {"head": 2}
        expected = reference(named, named, units, [[n] for n in named])
        np.testing.assert_allclose(every[s][0][:, columns], expected[:, columns].astype(np.float32), rtol=RTOL)
    norms = np.stack([every[s][0, :, COL["grad_norm"]] for s in range(len(seq))])
    assert 0 < norms[1, 0] < 1e-20 and 0 < norms[2, 3] < 1e-25 and 1e19 < norms[2, 1] < np.inf
    assert np.isnan(norms[3, 2]) and not np.isnan(norms[3, [0, 1, 3]]).any()
    windows = read_events(tmp_path / "window")
    assert [s for s, _, _ in windows] == [0, 3, 5]  # and the partial window at close
    for (step, window, _), first in zip(windows, [0, 1, 4]):
        steps = range(first, step + 1)
        with np.errstate(invalid="ignore"):
            expected = {"mean": norms[steps].mean(0), "max": norms[steps].max(0), "min": norms[steps].min(0)}
        for name, value in expected.items():
            got = window[metadata.AGGREGATES.index(name), :, COL["grad_norm"]]
            np.testing.assert_allclose(got, value.astype(np.float32), rtol=RTOL, err_msg=f"{name} at {step}")
    assert windows[1][1][0, 2, COL["first_nonfinite_offset"]] == 0  # slice 2's NaN at step 3
    assert windows[1][1][0, 0, COL["first_nonfinite_offset"]] == -1  # not slice 0's


class NnxBlock(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(16, 16, rngs=rngs)

    def __call__(self, x):
        return nnx.relu(self.linear(x)) + x


class NnxModel(nnx.Module):
    """An input layer, DEPTH blocks made by ``nnx.vmap`` and run by ``nnx.scan``, an output layer."""

    def __init__(self, rngs):
        self.inp = nnx.Linear(8, 16, rngs=rngs)

        @nnx.split_rngs(splits=DEPTH)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return NnxBlock(rngs)

        self.blocks = make(rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def body(x, block):
            return block(x)

        return self.out(body(self.inp(x), self.blocks))


def test_an_nnx_stack_made_by_vmap_and_run_by_scan_gets_a_row_per_block(tmp_path):
    model = NnxModel(nnx.Rngs(0))
    x, y = data()
    order = tj.depth_order(lambda m: m(x), model)
    assert order.stacked == {"blocks": (False,)}
    optimizer = nnx.Optimizer(model, tj.monitor(optax.sgd(1e-2), order=order), wrt=nnx.Param)

    def loss(m):
        return jnp.mean((m(x) - y) ** 2)

    grads = nnx.grad(loss)(model)
    expected = np.asarray(grads["blocks"]["linear"]["kernel"][...], np.float64)

    @nnx.jit
    def step(model, optimizer):
        optimizer.update(model, nnx.grad(loss)(model))

    with tj.GradientWriter(tmp_path) as writer:
        step(model, optimizer)
        writer.write(optimizer, 0)
    content = stats_content(tmp_path)
    assert content["layer"]["rows"] == ["inp", *[f"blocks/{i}/linear" for i in range(DEPTH)], "out"]
    ((_, variable, _),) = read_events(tmp_path, granularity="variable")
    kernels = [content["variable"]["rows"].index(f"blocks/{i}/linear/kernel") for i in range(DEPTH)]
    np.testing.assert_allclose(
        variable[0, kernels, COL["grad_norm"]], np.sqrt(np.sum(expected**2, axis=(1, 2))), rtol=RTOL
    )


class Sigmoid(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return nn.sigmoid(nn.Dense(16)(x)), None


class Deep(nn.Module):
    """Ten scanned sigmoid layers: the backward signal shrinks by sigmoid' <= 1/4 per layer toward the input."""

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(16)(x)
        x, _ = nn.scan(Sigmoid, variable_axes={"params": 0}, split_rngs={"params": True}, length=10)()(x, None)
        return nn.Dense(1)(x)


def report(logdir, capsys):
    """``{finding kind: layers}`` of ``tb-gradcheck report`` on the run (in this process: no second start-up)."""
    capsys.readouterr()
    assert cli.main(["report", str(logdir), "--format", "json", "--fail-on", "never"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"].values()
    return {f["kind"]: f["layers"] for f in run["findings"]}


@pytest.mark.parametrize("stacked", [None, {}])
def test_a_stack_that_vanishes_toward_the_input_is_found_on_its_first_slices_only_with_a_row_each(
    tmp_path, capsys, stacked
):
    x = data()[0]
    params = Deep().init(jax.random.PRNGKey(0), x)
    train(Deep(), params, tmp_path, steps=5, stacked=stacked)
    vanishing = report(tmp_path, capsys).get("vanishing", [])
    if stacked is None:  # depth_order's stacks: a row per slice
        assert "ScanSigmoid_0/0/Dense_0" in vanishing and "ScanSigmoid_0/1/Dense_0" in vanishing
        assert "ScanSigmoid_0/9/Dense_0" not in vanishing and "ScanSigmoid_0/8/Dense_0" not in vanishing
    else:  # one pooled row, dominated by the last slices: the decay is invisible
        assert vanishing == ["Dense_0"]


def test_stacked_is_checked_where_it_is_given():
    params = {"blk": {"w": jnp.zeros((3, 2, 2))}, "head": jnp.zeros(2)}
    with pytest.raises(TypeError, match="Expected `stacked`"):
        tj.monitor(stacked=["blk"])
    with pytest.raises(ValueError, match="at least 1 axis"):
        tj.monitor(stacked={"blk": 0})
    with pytest.raises(ValueError, match=r"Received: \['nope'\]"):
        tj.monitor(stacked={"nope": 1}).init(params)
    with pytest.raises(ValueError, match="stacked leading axes"):
        tj.monitor(stacked={"head": 2}).init(params)


def nested(p, x):
    """Plain JAX: a scan over ``blocks`` whose body scans ``inner`` in reverse; a scan const; a cast stack; a leaf read whole too."""

    def outer(h, block):
        def inner(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(inner, h, block["inner"]["w"], reverse=True)
        return jnp.tanh(h @ block["mix"]["w"]), None

    h, _ = jax.lax.scan(outer, x @ p["inp"], p["blocks"])
    shared = p["shared"]
    h, _ = jax.lax.scan(lambda h, _: (jnp.tanh(h @ shared), None), h, None, length=2)
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), h, p["cast"].astype(jnp.bfloat16).astype(jnp.float32))
    total = jax.lax.scan(lambda c, w: (c, jnp.sum(w * w)), 0.0, p["both"])[1]
    return jnp.sum(h @ p["both"][0]) + jnp.sum(total)


def test_nested_scans_stack_two_axes_and_only_scanned_over_operands_are_stacked(tmp_path):
    rng = np.random.default_rng(3)

    def normal(*shape):
        return jnp.asarray(rng.normal(size=shape) / 2, jnp.float32)

    params = {
        "inp": normal(3, 4),
        "blocks": {"inner": {"w": normal(3, 2, 4, 4)}, "mix": {"w": normal(3, 4, 4)}},
        "shared": normal(4, 4),  # a scan's const: the same weights at every iteration
        "cast": normal(2, 4, 4),  # scanned over in bfloat16
        "both": normal(2, 4, 4),  # scanned over, and its slice 0 read outside the scan
    }
    x = normal(2, 3)
    order = tj.depth_order(nested, params, x)
    assert order.stacked == {"blocks": (False,), "blocks/inner": (True,), "cast": (False,)}
    tx = tj.monitor(order=order)
    state = tx.init(params)
    grads = jax.grad(nested)(params, x)
    _, state = jax.jit(tx.update)(grads, state, params)
    with tj.GradientWriter(tmp_path) as writer:
        writer.write(state, 0)
    names = stats_content(tmp_path)["variable"]["rows"]
    per_block = [[f"blocks/{i}/inner/1/w", f"blocks/{i}/inner/0/w", f"blocks/{i}/mix/w"] for i in range(3)]
    assert names == ["inp", *sum(per_block, []), "shared", "cast/0", "cast/1", "both"]
    g = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), grads)
    expected = [np.linalg.norm(g["inp"])]
    for i in range(3):
        expected += [np.linalg.norm(g["blocks"]["inner"]["w"][i, j]) for j in (1, 0)]
        expected.append(np.linalg.norm(g["blocks"]["mix"]["w"][i]))
    expected += [np.linalg.norm(g["shared"]), *[np.linalg.norm(g["cast"][i]) for i in range(2)]]
    expected.append(np.linalg.norm(g["both"]))
    ((_, variable, _),) = read_events(tmp_path, granularity="variable")
    np.testing.assert_allclose(variable[0, :, COL["grad_norm"]], expected, rtol=RTOL)


def test_a_stack_sharded_over_four_devices_on_its_layer_axis_or_its_units_writes_the_rows_of_one_device(tmp_path):
    job = pathlib.Path(__file__).resolve().parents[1] / "jax_sharded_job.py"
    env = dict(os.environ, PYTHONPATH=str(job.parent.parent))
    out = subprocess.run(
        [sys.executable, str(job), str(tmp_path), "2", "stacked"], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    sharded, stack, single = (json.loads(line) for line in out.stdout.strip().splitlines()[-3:])
    assert sharded["kernel_devices"] == stack["kernel_devices"] == [4] * 4 and single["kernel_devices"] == [1] * 4
    # Split along its units (every layer on every device), or along its layers (two layers a device).
    assert sharded["stack_specs"] == ["P(None, None, 'model')"]
    assert stack["stack_specs"] == ["P('model', None, None)"]
    rows = stats_content(tmp_path / "single")["layer"]["rows"]
    assert rows == ["Dense_0", "blocks/0", "blocks/1", "blocks/2", "blocks/3", "Dense_1"]
    for run in ("sharded", "sharded_stack"):
        assert stats_content(tmp_path / run) == stats_content(tmp_path / "single")
        for granularity in ("layer", "variable"):
            a = read_events(tmp_path / run, granularity=granularity)
            b = read_events(tmp_path / "single", granularity=granularity)
            assert [s for s, _, _ in a] == [s for s, _, _ in b] == [0, 2, 4]
            for (_, x, _), (_, y, _) in zip(a, b):
                # The same global arrays reduced in another order: float32 rounding only.
                np.testing.assert_allclose(x, y, rtol=RTOL, atol=1e-7, err_msg=run)


def test_close_with_the_params_gives_each_slice_of_a_stack_its_weight_norm_in_the_partial_window(tmp_path):
    """The window under way at close: ``close(params)`` gives every row its weight norm, a stacked slice its own."""
    params = scanned_params()
    x, y = data()
    tx = tj.monitor(optax.adam(1e-2), every_n_steps=2, order=tj.depth_order(Scanned().apply, params, x))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state):
        grads = jax.grad(lambda p: jnp.mean((Scanned().apply(p, x) - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    writer = tj.GradientWriter(tmp_path)
    for s in range(4):  # written at 0 and 2; 3 is the partial window at close
        params, opt_state = step(params, opt_state)
        writer.write(opt_state, s)
    writer.close(params)
    unrolled = by_name(unrolled_params(params))
    inner = ["kernel", "bias"]
    expected = [unrolled["inp/kernel"], unrolled["inp/bias"]]
    expected += [unrolled[f"layer_{i}/Dense_0/{k}"] for i in range(DEPTH) for k in inner]
    expected += [unrolled["out/kernel"], unrolled["out/bias"]]
    step_, window, _ = read_events(tmp_path, granularity="variable")[-1]
    assert step_ == 3
    got = window[metadata.AGGREGATES.index("last"), :, COL["weight_norm"]]
    np.testing.assert_allclose(got, [np.linalg.norm(w.ravel()) for w in expected], rtol=RTOL)


def test_close_with_params_the_monitor_does_not_see_warns_that_the_weight_norm_is_missing(tmp_path):
    """A monitor inside optax.masked sees part of the model: the whole model's params cannot give its rows' norms."""
    params = scanned_params()
    x, y = data()
    trained = {"params": {"Dense_0": True, "ScanBlock_0": False, "Dense_1": False}}
    tx = optax.masked(tj.monitor(optax.adam(1e-2), every_n_steps=2), trained)
    opt_state = tx.init(params)
    grads = jax.grad(lambda p: jnp.mean((Scanned().apply(p, x) - y) ** 2))(params)
    writer = tj.GradientWriter(tmp_path)
    for s in range(2):  # 0 written, 1 the partial window at close
        _, opt_state = tx.update(grads, opt_state, params)
        writer.write(opt_state, s)
    with pytest.warns(UserWarning, match=r"weight_norm is MISSING: `close\(params\)` was given a pytree of 6 leaves"):
        writer.close(params)
    step, window, _ = read_events(tmp_path, granularity="variable")[-1]
    assert step == 1 and np.all(window[metadata.AGGREGATES.index("last"), :, COL["weight_norm"]] == -1)
