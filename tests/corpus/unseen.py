"""Runs the rules were not tuned on: JAX/optax, PyTorch with ``activations=True``, a LLaMA-style decoder.

Added after the rules to test whether they hold on runs they never saw:
plain-JAX models written by ``tb_gradcheck.jax`` (``monitor`` wrapping an
optax optimizer), PyTorch models written with the forward side
(``GradientWriter(..., activations=True)``), whose saturated, growth and
massive-activation findings no other scenario exercises, and a LLaMA-style
decoder (RMSNorm, SwiGLU, rotary positions) built from a tiny
``LlamaConfig``. Every training function takes a ``seed``; the corpus
registers seed 0, and every premise was checked at seeds 0, 1 and 2.
"""

import collections
import math

import numpy as np
import torch
from torch import nn

from corpus.fine_tunes import _lm_loss
from corpus.fine_tunes import _quadrants
from corpus.fine_tunes import hf_trainer
from corpus.healthy import _batches
from corpus.healthy import _regression
from corpus.registry import Expect
from corpus.registry import head_tail
from corpus.registry import scenario
from corpus.torch_runs import _mlp
from tb_gradcheck.torch import GradientWriter

torch.set_num_threads(1)


# --- JAX -------------------------------------------------------------------------------------------------------------


def _jax_mlp_params(seed, widths, features, scale):
    """``{"dense_i": {"kernel", "bias"}}`` and ``"out"``: kernels normal with std ``scale(fan_in)``, zero biases."""
    rng = np.random.default_rng(seed)
    params, fan_in = {}, features
    for i, width in enumerate([*widths, 1]):
        name = "out" if i == len(widths) else f"dense_{i}"
        kernel = rng.normal(0.0, scale(fan_in), (fan_in, width)).astype(np.float32)
        params[name] = {"kernel": kernel, "bias": np.zeros(width, np.float32)}
        fan_in = width
    return params


def _jax_fit(run_dir, params, activation, batches, optimizer):
    """MSE training of a plain-pytree MLP, written by ``tb_gradcheck.jax``.

    Returns:
      ``(losses, final params, loss_fn, first step with a NaN or Inf gradient element or None)``.
    """
    import jax
    import jax.numpy as jnp

    import tb_gradcheck.jax as tj

    names = [k for k in params if k not in ("out", "aux")]

    def forward(p, x):
        """The output, and an auxiliary head's (the loss never uses it) where ``params`` has one."""
        for name in names:
            x = activation(x @ p[name]["kernel"] + p[name]["bias"])
        aux = x @ p["aux"]["kernel"] + p["aux"]["bias"] if "aux" in p else None
        return x @ p["out"]["kernel"] + p["out"]["bias"], aux

    def loss_fn(p, x, y):
        return jnp.mean((forward(p, x)[0] - y) ** 2)

    params = jax.tree.map(jnp.asarray, params)
    x0 = jnp.zeros((1, params[names[0]]["kernel"].shape[0]), jnp.float32)
    tx = tj.monitor(optimizer, order=tj.depth_order(loss_fn, params, x0, jnp.zeros((1, 1), jnp.float32)))
    state = tx.init(params)

    @jax.jit
    def step(p, s, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, s = tx.update(grads, s, p)
        finite = jnp.all(jnp.array([jnp.isfinite(g).all() for g in jax.tree.leaves(grads)]))
        return jax.tree.map(lambda a, b: a + b, p, updates), s, loss, finite

    losses, finite = [], []
    with tj.GradientWriter(run_dir) as writer:
        for i, (x, y) in enumerate(batches):
            params, state, loss, ok = step(params, state, jnp.asarray(x), jnp.asarray(y))
            writer.write(state, i)
            losses.append(float(loss))
            finite.append(bool(ok))
        writer.close(params)
    bad = ~np.array(finite)
    return np.array(losses), params, loss_fn, (int(np.argmax(bad)) if bad.any() else None)


@scenario()
def jax_mlp_adam(run_dir, seed=0):
    """A 3-layer ReLU MLP in plain JAX (a pytree of kernels and biases, He's normal init) trained by optax's Adam at 1e-3 inside a jitted step, written by ``tb_gradcheck.jax.monitor`` wrapping the optimizer: the textbook healthy regression (He et al. 2015; Kingma & Ba 2015) in another framework. The loss falls by more than half; no finding."""
    import optax

    x, y = _regression(seed)
    params = _jax_mlp_params(seed, [64] * 3, 16, lambda n: math.sqrt(2.0 / n))
    import jax

    losses, *_ = _jax_fit(run_dir, params, jax.nn.relu, _batches(x, y, 64, 300, seed), optax.adam(1e-3))
    first, last = head_tail(losses)
    return {"loss_first": first, "loss_last": last}, [
        ("no loss is NaN or Inf", bool(np.isfinite(losses).all())),
        ("the loss fell by half or more", last <= 0.5 * first),
    ]


@scenario()
def jax_unused_aux_head(run_dir, seed=0):
    """The healthy plain-JAX ReLU MLP with a second head the loss never uses (a pooler a masked language model skips, an auxiliary output computed for logging). ``jax.grad`` gives that head zeros, not None; the order is ``depth_order`` of the loss, which finds it has no gradient path, so its rows say "no gradient" as TensorFlow's and PyTorch's do, not a dead layer. The loss falls by more than half; no finding."""
    import jax
    import jax.numpy as jnp
    import optax

    x, y = _regression(seed)
    params = _jax_mlp_params(seed, [64] * 3, 16, lambda n: math.sqrt(2.0 / n))
    params["aux"] = {"kernel": np.full((64, 8), 0.1, np.float32), "bias": np.zeros(8, np.float32)}
    losses, params, loss_fn, _ = _jax_fit(run_dir, params, jax.nn.relu, _batches(x, y, 64, 300, seed), optax.adam(1e-3))
    first, last = head_tail(losses)
    aux = jax.grad(loss_fn)(params, jnp.asarray(x), jnp.asarray(y))["aux"]
    return {"loss_first": first, "loss_last": last}, [
        ("the loss fell by half or more", last <= 0.5 * first),
        ("jax.grad gives the auxiliary head exact zeros", all(not np.any(g) for g in jax.tree.leaves(aux))),
    ]


@scenario(
    Expect("vanishing", ("dense_0", "dense_1"), allowed=r"dense_\d+", severity="warning"),
    Expect("not_learning", (), allowed=r"dense_\d+", under="vanishing"),
)
def jax_deep_sigmoid(run_dir, seed=0):
    """A 12-layer sigmoid MLP in plain JAX at LeCun's normal init (std 1/sqrt(fan_in)) trained by optax's SGD at 0.1: the sigmoid's slope is at most 1/4, so the backward signal shrinks about four-fold per layer (Glorot & Bengio 2010) and the input layers' gradients sit orders below the output's. Vanishing, at the input side, in a framework the rules were not tuned on."""
    import jax
    import jax.numpy as jnp
    import optax

    x, y = _regression(seed)
    params = _jax_mlp_params(seed, [64] * 12, 16, lambda n: 1.0 / math.sqrt(n))
    _, params, loss_fn, _ = _jax_fit(run_dir, params, jax.nn.sigmoid, _batches(x, y, 64, 200, seed), optax.sgd(0.1))
    grads = jax.grad(loss_fn)(params, jnp.asarray(x), jnp.asarray(y))
    orders = float(jnp.log10(jnp.linalg.norm(grads["out"]["kernel"]) / jnp.linalg.norm(grads["dense_0"]["kernel"])))
    return {"output_over_input_orders": orders}, [("input layer 3+ orders below the output layer", orders >= 3.0)]


@scenario(
    Expect("non_finite", ("dense_0", "dense_1", "dense_2", "out"), at="first_nonfinite_step", severity="error"),
    Expect("exploding", (), allowed=r"dense_\d|out", before="first_nonfinite_step", severity="error"),
)
def jax_sgd_diverges(run_dir, seed=0):
    """The healthy plain-JAX ReLU MLP with optax's SGD at a learning rate of 0.5, far beyond the stable step for its curvature (LeCun et al. 1998, "Efficient BackProp": above twice the inverse of the largest Hessian eigenvalue the iterates diverge): the loss and the gradients grow by orders from step to step until they overflow to Inf and NaN. Every layer's gradient turns non-finite at the same step; an explosion may be named before it."""
    import jax
    import optax

    x, y = _regression(seed)
    params = _jax_mlp_params(seed, [64] * 3, 16, lambda n: math.sqrt(2.0 / n))
    losses, _, _, first_bad = _jax_fit(run_dir, params, jax.nn.relu, _batches(x, y, 64, 100, seed), optax.sgd(0.5))
    finite = losses[np.isfinite(losses)]
    numbers = {
        "first_nonfinite_step": first_bad,
        "loss_first": float(losses[0]),
        "largest_finite_loss": float(finite.max()),
    }
    return numbers, [
        ("a gradient turned non-finite within the first 50 steps", first_bad is not None and first_bad < 50),
        ("the loss grew 1e6-fold or more before it", numbers["largest_finite_loss"] >= 1e6 * losses[0]),
    ]


@scenario(Expect("dead", ("dense_1",), allowed=r"dense_\d", severity="warning"))
def jax_dying_relu(run_dir, seed=0):
    """The plain-JAX ReLU MLP with optax's Adam at 5e-2, fifty times its healthy rate: the first large steps throw the hidden layers' biases negative and most of their units stop firing on every example, for good (the dying ReLU, Lu et al. 2019). ``tb_gradcheck.jax`` counts a unit (a kernel's output column and its bias element, Keras' rule) dead when its gradient is exactly zero on the batch; the premise counts the units whose ReLU output is zero on every example at the end."""
    import jax
    import jax.numpy as jnp
    import optax

    x, y = _regression(seed)
    params = _jax_mlp_params(seed, [64] * 3, 16, lambda n: math.sqrt(2.0 / n))
    _, params, _, _ = _jax_fit(run_dir, params, jax.nn.relu, _batches(x, y, 64, 200, seed), optax.adam(5e-2))
    h, shares = jnp.asarray(x), {}
    for i in range(3):
        h = jax.nn.relu(h @ params[f"dense_{i}"]["kernel"] + params[f"dense_{i}"]["bias"])
        shares[f"silent_dense_{i}_end"] = float((h <= 0).all(axis=0).mean())
    return shares, [("half or more of dense_1 silent on every example at the end", shares["silent_dense_1_end"] >= 0.5)]


# --- PyTorch with activations=True ------------------------------------------------------------------------------------


def _torch_fit(run_dir, model, batches, optimizer, loss_fn=nn.functional.mse_loss):
    """Training written with the optimizer and the forward side (``activations=True``); the losses."""
    losses = []
    with GradientWriter(run_dir, model, optimizer=optimizer, activations=True) as writer:
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            loss = loss_fn(model(torch.as_tensor(x)), torch.as_tensor(y))
            loss.backward()
            writer.write(step)
            optimizer.step()
            losses.append(float(loss.detach()))
    return np.array(losses)


def _outputs(model, names, x):
    """``{name: output}`` of the named modules on ``x`` (forward hooks, training mode off)."""
    seen = {}
    hooks = [
        getattr(model, n).register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o.detach())) for n in names
    ]
    model.eval()
    try:
        with torch.no_grad():
            model(torch.as_tensor(x))
    finally:
        for h in hooks:
            h.remove()
        model.train()
    return seen


def _tanh_mlp(init):
    """The 4-layer tanh MLP of width 64 of the saturation scenarios, ``init(linear)`` applied to each hidden layer."""
    model = _mlp([64] * 4, nn.Tanh, he=False)
    with torch.no_grad():
        for name, module in model.named_children():
            if isinstance(module, nn.Linear) and name != "out":
                init(module)
    return model


def _saturated_shares(model, x, when):
    """``{saturated_dense_<i>_<when>: share of tanh outputs within 1% of +-1}`` of the hidden layers on ``x``."""
    outs = _outputs(model, [f"act_{i}" for i in range(4)], x)
    return {f"saturated_dense_{i}_{when}": float((o.abs() >= 0.98).float().mean()) for i, o in enumerate(outs.values())}


def _bn_cnn():
    blocks = collections.OrderedDict()
    for i, (cin, cout) in enumerate([(3, 16), (16, 32)]):
        blocks[f"conv_{i}"] = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        blocks[f"bn_{i}"] = nn.BatchNorm2d(cout)
        blocks[f"relu_{i}"] = nn.ReLU()
        blocks[f"pool_{i}"] = nn.MaxPool2d(2)
    blocks["flatten"] = nn.Flatten()
    blocks["head"] = nn.Linear(32 * 4 * 4, 4)
    return nn.Sequential(blocks)


@scenario()
def torch_bn_cnn_activations(run_dir, seed=0):
    """A two-block Conv-BatchNorm-ReLU CNN (Ioffe & Szegedy 2015) classifying which quadrant of a noisy 16x16 image is bright, Adam at 1e-3, written with ``activations=True``. BatchNorm holds each channel's input to the ReLU near zero mean and unit variance, so no channel is silent on a batch and no output grows: healthy, and the forward-side rules (dead by output, growth, massive values) must stay quiet."""
    torch.manual_seed(seed)
    x, labels = _quadrants(1024, seed)
    model = _bn_cnn()
    rng = np.random.default_rng(seed)
    batches = ((x[i], labels[i]) for i in (rng.integers(0, len(x), 32) for _ in range(150)))
    losses = _torch_fit(
        run_dir, model, batches, torch.optim.Adam(model.parameters(), 1e-3), nn.functional.cross_entropy
    )
    held_x, held_y = _quadrants(500, seed + 100)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(held_x).argmax(-1) == held_y).float().mean())
    first, last = head_tail(losses)
    return {"loss_first": first, "loss_last": last, "held_out_accuracy": accuracy}, [
        ("the loss fell by half or more", last <= 0.5 * first),
        ("held-out accuracy 0.9 or more (chance 0.25)", accuracy >= 0.9),
    ]


@scenario(Expect("dead", ("dense_1",), allowed=r"dense_\d", severity="warning"))
def torch_dying_relu_activations(run_dir, seed=0):
    """A 3-layer ReLU MLP trained by SGD at a learning rate far too large for it (0.5, with momentum 0.9): the first steps throw the biases of the hidden layers negative and most of their units stop firing on every example for good (the dying ReLU, Lu et al. 2019; Karpathy's "yes you should understand backprop"). Written with ``activations=True``, so the dead finding has both views: the share of units without gradient and the share whose ReLU output is zero on the whole batch, which the premise measures on every example."""
    torch.manual_seed(seed)
    x, y = _regression(seed)
    model = _mlp([64] * 3, nn.ReLU)
    _torch_fit(run_dir, model, _batches(x, y, 64, 200, seed), torch.optim.Adam(model.parameters(), 5e-2))
    outs = _outputs(model, ["act_0", "act_1", "act_2"], x)
    shares = {f"silent_dense_{i}_end": float((outs[f"act_{i}"] <= 0).all(dim=0).float().mean()) for i in range(3)}
    return shares, [("half or more of dense_1 silent on every example at the end", shares["silent_dense_1_end"] >= 0.5)]


@scenario(
    Expect("saturated", ("dense_1", "dense_2"), allowed=r"dense_\d", severity="warning"),
    Expect("vanishing", (), allowed=r"dense_\d"),
)
def torch_tanh_large_init_activations(run_dir, seed=0):
    """A 4-layer tanh MLP whose kernels are drawn with standard deviation 1 whatever the fan-in (an init 8 times Xavier's at width 64; Glorot & Bengio 2010, LeCun et al. 1998 "Efficient BackProp"): every hidden pre-activation has a standard deviation near 8, so most tanh outputs sit at plus or minus one and pass back almost no gradient. Written with ``activations=True``: the saturated finding must name the hidden layers after the first (the first one's input is the unit-scale data, std 4, still mostly saturated)."""
    torch.manual_seed(seed)
    x, y = _regression(seed)
    model = _tanh_mlp(lambda linear: linear.weight.normal_(0.0, 1.0))
    shares = _saturated_shares(model, x, "start")
    _torch_fit(run_dir, model, _batches(x, y, 64, 150, seed), torch.optim.SGD(model.parameters(), 1e-2))
    shares.update(_saturated_shares(model, x, "end"))
    return shares, [
        (
            f"half or more of dense_{i}'s outputs within 1% of +-1 at the {when}",
            shares[f"saturated_dense_{i}_{when}"] >= 0.5,
        )
        for i in (1, 2)
        for when in ("start", "end")
    ]


@scenario()
def torch_tanh_xavier_activations(run_dir, seed=0):
    """The same 4-layer tanh MLP at Xavier's (Glorot's) normal init, std sqrt(2 / (fan_in + fan_out)), which keeps each layer's pre-activations near unit scale (Glorot & Bengio 2010), trained by Adam at 1e-3 and written with ``activations=True``: the control of the large-init run. Its outputs stay mostly in tanh's linear range and it learns; no saturated finding, no warning."""
    torch.manual_seed(seed)
    x, y = _regression(seed)
    model = _tanh_mlp(lambda linear: (nn.init.xavier_normal_(linear.weight), nn.init.zeros_(linear.bias)))
    losses = _torch_fit(run_dir, model, _batches(x, y, 64, 200, seed), torch.optim.Adam(model.parameters(), 1e-3))
    first, last = head_tail(losses)
    shares = _saturated_shares(model, x, "end")
    return {"loss_first": first, "loss_last": last, **shares}, [
        ("the loss fell by half or more", last <= 0.5 * first),
        ("under a fifth of every hidden layer's outputs within 1% of +-1", max(shares.values()) < 0.2),
    ]


# --- A LLaMA-style decoder -------------------------------------------------------------------------------------------


def _counting(n, seed):
    """Sequences counting modulo 128 from a random start by a random stride (1, 2 or 3): after the first two tokens, every token is predictable from the last two."""
    rng = np.random.default_rng(seed)
    start, stride = rng.integers(0, 128, (n, 1)), rng.integers(1, 4, (n, 1))
    return torch.from_numpy((start + stride * np.arange(32)) % 128)


def _llama(seed):
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _lm_premises(losses, held_out):
    first, last = head_tail(losses)
    numbers = {"loss_first": first, "loss_last": last, **held_out}
    return numbers, [
        ("no loss is NaN or Inf", bool(np.isfinite(losses).all())),
        ("the loss fell by half", last <= 0.5 * first),
        # Uniform over 128 tokens: ln 128 = 4.85 nats; the floor, only the second token's stride unknown: ln 3 / 31.
        ("held-out loss under 0.5 nats (uniform: 4.85)", held_out["held_out_loss"] < 0.5),
    ]


@scenario()
def llama_hf_trainer(run_dir, seed=0):
    """A LLaMA-style decoder (Touvron et al. 2023: RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention; 2 blocks, width 64) built from a ``LlamaConfig`` and trained by the Hugging Face Trainer (AdamW, linear warm-up and decay) to continue sequences counting modulo 128 by a stride of 1, 2 or 3, written by ``tb_gradcheck.transformers.GradientCallback``. Healthy: it learns to count on (held-out loss near its floor); no finding. (A 4-token motif to copy, GPT-2's task here, this decoder only half learns in 250 steps, without a finding either: a slower learner, not a fault.)"""
    model = _llama(seed)
    ids = _counting(2000, seed)
    losses, _ = hf_trainer(run_dir, model, [{"input_ids": i, "labels": i} for i in ids], seed, 3e-3)
    return _lm_premises(losses, _lm_loss(_counting(500, seed + 100))(model))


@scenario()
def llama_plain_loop_activations(run_dir, seed=0):
    """The same LLaMA-style decoder trained by a plain PyTorch loop (AdamW at 3e-3, gradient clipping at 1, as LLaMA's recipe clips) and written by ``tb_gradcheck.torch.GradientWriter`` with ``activations=True``: the forward side of RMSNorm, SwiGLU and rotary attention, which no other scenario records. Healthy: no growth of the outputs by orders, no massive value (outputs of 100 and 1000 times the RMS appear in large trained LLMs, Sun et al. 2024, not in a 2-block model after 200 steps), and no warning."""
    model = _llama(seed)
    ids = _counting(2000, seed)
    optimizer = torch.optim.AdamW(model.parameters(), 3e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    losses = []
    with GradientWriter(run_dir, model, optimizer=optimizer, activations=True) as writer:
        for step in range(200):
            batch = ids[rng.integers(0, len(ids), 16)]
            optimizer.zero_grad()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            writer.write(step)
            optimizer.step()
            losses.append(float(loss.detach()))
    return _lm_premises(np.array(losses), _lm_loss(_counting(500, seed + 100))(model))
