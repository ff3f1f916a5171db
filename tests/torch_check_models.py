"""Small PyTorch models for the gradient-check tests and benchmark: planted bugs in custom autograd Functions, correct models.

Every builder takes a seed and returns a ``Case``: a model with weights
drawn from that seed, a fixed batch, the loss as ``loss(model, batch)``,
and the rows whose gradient is wrong (none for a correct model). The
planted kinds mirror tests/check_models.py (TensorFlow): each forward pass
is right and one hand-written backward pass is wrong in one specific way.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Case:
    """A model, its batch and loss; ``wrong``: the rows (module paths) whose gradient is wrong."""

    model: nn.Module
    batch: tuple
    loss: object  # loss(model, batch) -> scalar tensor
    wrong: tuple = ()

    def closure(self):
        """The zero-argument loss over this case's model and batch."""
        return lambda: self.loss(self.model, self.batch)


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def cross_entropy(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


# -- planted bugs ---------------------------------------------------------------------------


# The output unit whose weight-gradient row the ``row`` kind scales.
ROW = 5


class PlantedLinearFunction(torch.autograd.Function):
    """``x @ w.T + b`` with a backward pass wrong in the way ``kind`` says (None: right).

    Kinds: ``scale`` (weight and bias gradients x1.03), ``sign`` (the weight
    gradient negated: the wrong sign on one input), ``input_sign`` (the
    input's gradient negated: the layers below get the wrong gradient),
    ``transpose`` (the weight gradient transposed; square weights),
    ``element`` (one weight-gradient element doubled), ``row`` (one
    weight-gradient row, output unit ROW, 1.3x too large), ``bias_mean`` (the
    bias gradient averaged over the batch instead of summed) and
    ``cancel`` (the weight gradient computed as (dy + C)^T x - C sum(x),
    exact in exact arithmetic and in float64, ~10% off in float32).
    """

    @staticmethod
    def forward(ctx, x, w, b, kind):
        ctx.save_for_backward(x, w)
        ctx.kind = kind
        return x @ w.T + b

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        kind = ctx.kind
        dx, dw, db = dy @ w, dy.T @ x, dy.sum(0)
        if kind == "scale":
            dw, db = 1.03 * dw, 1.03 * db
        elif kind == "sign":
            dw = -dw
        elif kind == "input_sign":
            dx = -dx
        elif kind == "transpose":
            dw = dw.T
        elif kind == "element":
            dw = dw.clone()
            dw[1, 2] *= 2.0
        elif kind == "row":
            dw = dw.clone()
            dw[ROW] *= 1.3
        elif kind == "bias_mean":
            db = dy.mean(0)
        elif kind == "cancel":
            offset = 1e4
            dw = (dy + offset).T @ x - offset * x.sum(0)
        return dx, dw, db, None


class PlantedLinear(nn.Module):
    def __init__(self, fan_in, fan_out, kind=None):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.empty(fan_out, fan_in))
        self.bias = nn.Parameter(torch.empty(fan_out))
        nn.init.xavier_uniform_(self.weight)
        nn.init.uniform_(self.bias, -0.1, 0.1)

    def forward(self, x):
        return PlantedLinearFunction.apply(x, self.weight, self.bias, self.kind)


class PlantedLayerNormFunction(torch.autograd.Function):
    """Layer normalisation with scale and shift; ``wrong`` drops the input gradient's mean and variance terms."""

    @staticmethod
    def forward(ctx, x, gamma, beta, wrong, eps=1e-3):
        mean = x.mean(-1, keepdim=True)
        inv = torch.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)
        xhat = (x - mean) * inv
        ctx.save_for_backward(xhat, inv, gamma)
        ctx.wrong = wrong
        return xhat * gamma + beta

    @staticmethod
    def backward(ctx, dy):
        xhat, inv, gamma = ctx.saved_tensors
        dxhat = dy * gamma
        if ctx.wrong:
            dx = dxhat * inv
        else:
            dx = inv * (dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        return dx, (dy * xhat).sum(0), dy.sum(0), None, None


class PlantedLayerNorm(nn.Module):
    def __init__(self, width, wrong=False):
        super().__init__()
        self.wrong = wrong
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        return PlantedLayerNormFunction.apply(x, self.weight, self.bias, self.wrong)


class PlantedSoftmaxFunction(torch.autograd.Function):
    """Softmax over the last axis; ``wrong`` drops the ``- sum(p * dp)`` term of its Jacobian."""

    @staticmethod
    def forward(ctx, s, wrong):
        p = torch.softmax(s, -1)
        ctx.save_for_backward(p)
        ctx.wrong = wrong
        return p

    @staticmethod
    def backward(ctx, dp):
        (p,) = ctx.saved_tensors
        if ctx.wrong:
            return p * dp, None
        return p * (dp - (p * dp).sum(-1, keepdim=True)), None


class PlantedAttention(nn.Module):
    """Single-head self-attention with a hand-written softmax backward pass."""

    def __init__(self, dim, wrong=False):
        super().__init__()
        self.wrong = wrong
        self.query = nn.Linear(dim, dim, bias=False)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        return PlantedSoftmaxFunction.apply(scores, self.wrong) @ v


class ForgetfulDropoutFunction(torch.autograd.Function):
    """Dropout whose backward pass forgets the mask (scales by 1 / keep everywhere): wrong in training mode only."""

    @staticmethod
    def forward(ctx, x, rate):
        keep = 1.0 - rate
        mask = (torch.rand_like(x) < keep).to(x.dtype) / keep
        ctx.keep = keep
        return x * mask

    @staticmethod
    def backward(ctx, dy):
        return dy / ctx.keep, None


class ForgetfulDropout(nn.Module):
    def __init__(self, rate=0.3):
        super().__init__()
        self.rate = rate

    def forward(self, x):
        return ForgetfulDropoutFunction.apply(x, self.rate) if self.training else x


class GaussianNoise(nn.Module):
    """Adds Gaussian noise of standard deviation ``scale`` in training mode (a regulariser)."""

    def __init__(self, scale=0.3):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x + self.scale * torch.randn_like(x) if self.training else x


def _mlp_batch(generator, batch=16, width=8, dtype=torch.float32):
    x = torch.randn(batch, width, generator=generator, dtype=dtype)
    y = torch.randn(batch, 1, generator=generator, dtype=dtype)
    return x, y


def planted(kind, seed=0, width=16):
    """A model whose rows ``Case.wrong`` get a wrong gradient from planted bug ``kind``.

    Kinds: those of PlantedLinearFunction in ``body.2`` of an 8 -> width ->
    width -> 1 tanh MLP (``input_sign``: in ``body.0``, the layer below);
    ``layer_norm`` (missing terms: ``body.0`` below the norm is wrong);
    ``attention`` (the softmax's missing term: the query and key projections
    and the embedding below are wrong).
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1000)
    if kind == "layer_norm":
        body = nn.Sequential(nn.Linear(8, width), PlantedLayerNorm(width, wrong=True), nn.Tanh())
        model = nn.Sequential()
        model.body, model.head = body, nn.Linear(width, 1)
        return Case(model, _mlp_batch(generator), mse, ("body.0",))
    if kind == "attention":
        model = AttentionNet(PlantedAttention(8, wrong=True))
        x = torch.randn(16, 6, 4, generator=generator)
        y = torch.randn(16, 1, generator=generator)
        return Case(model, (x, y), mse, ("embed", "attention.query", "attention.key"))
    body = nn.Sequential(nn.Linear(8, width), nn.Tanh(), PlantedLinear(width, width, kind), nn.Tanh())
    model = nn.Sequential()
    model.body, model.head = body, nn.Linear(width, 1)
    wrong = ("body.0",) if kind == "input_sign" else ("body.2",)
    return Case(model, _mlp_batch(generator), mse, wrong)


def localized(seed=0, width=48, kind="row"):
    """A 4-layer tanh MLP (8 -> width -> width -> width -> 1) whose ``fc2`` backward has planted bug ``kind``.

    With ``kind="row"``, one of fc2's ``width`` weight-gradient rows is 1.3x
    too large: ~0.1% of the row's gradient along itself at width 48, under
    float32's power (the float32 check leaves it inconclusive or calls it ok
    at most seeds) and far above float64's. ``kind=None``: the same model, correct.
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1000)
    model = nn.Sequential()
    model.fc1, model.act1 = nn.Linear(8, width), nn.Tanh()
    model.fc2, model.act2 = PlantedLinear(width, width, kind), nn.Tanh()
    model.fc3, model.act3 = nn.Linear(width, width), nn.Tanh()
    model.fc4 = nn.Linear(width, 1)
    return Case(model, _mlp_batch(generator, batch=32), mse, ("fc2",) if kind else ())


# Caught by the default float32 check along the gradient (the TensorFlow check's DEFAULT_CATCHES).
PLANTED_KINDS = ("scale", "sign", "input_sign", "transpose", "layer_norm", "attention")
# Confined to a small part of a row: the float64 twin's business (or thorough mode's).
LOCALIZED_KINDS = ("element", "bias_mean")


class AttentionNet(nn.Module):
    """embed (Linear 4 -> 8) over a 6-step sequence, an attention block, a linear head on the flattened result."""

    def __init__(self, attention):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attention = attention
        self.head = nn.Linear(6 * 8, 1)

    def forward(self, x):
        h = self.attention(self.embed(x))
        if isinstance(h, tuple):  # nn.MultiheadAttention: (output, weights)
            h = h[0]
        return self.head(h.flatten(1))


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` used as self-attention (query = key = value)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return self.attention(x, x, x, need_weights=False)[0]


# -- correct models -------------------------------------------------------------------------


def clean(kind, seed=0):
    """A correct model of one of CLEAN_KINDS, weights and batch drawn from ``seed``."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1000)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
        return Case(model, _mlp_batch(generator), mse)
    if kind == "cnn":
        model = nn.Sequential(
            nn.Conv2d(2, 4, 3), nn.Tanh(), nn.Conv2d(4, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
        )
        x = torch.randn(8, 2, 8, 8, generator=generator)
        y = torch.randint(0, 3, (8,), generator=generator)
        return Case(model, (x, y), cross_entropy)
    if kind == "layer_norm":
        model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 1))
        with torch.no_grad():  # not the initial ones and zeros: a scale and shift of their own
            model[1].weight.uniform_(0.5, 1.5)
            model[1].bias.uniform_(-0.1, 0.1)
        return Case(model, _mlp_batch(generator), mse)
    if kind == "attention":
        model = AttentionNet(SelfAttention(8, 2))
        x = torch.randn(16, 6, 4, generator=generator)
        y = torch.randn(16, 1, generator=generator)
        return Case(model, (x, y), mse)
    if kind == "embedding":
        model = nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(5 * 8, 1))
        x = torch.randint(0, 50, (16, 5), generator=generator)
        y = torch.randn(16, 1, generator=generator)
        return Case(model, (x, y), mse)
    if kind == "relu_padded":
        # Zero biases and zero-padded rows: three quarters of the batch puts
        # every ReLU input exactly at its kink, where torch's relu'(0) = 0.
        model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
        for m in model:
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        x = torch.randn(16, 10, generator=generator)
        x[:12] = 0.0
        y = torch.randn(16, 1, generator=generator)
        return Case(model, (x, y), mse)
    if kind == "relu":
        model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
        return Case(model, _mlp_batch(generator, width=10), mse)
    if kind == "train_mode":
        # Dropout and BatchNorm in training mode: a fresh mask and batch
        # statistics per call, running statistics written by every forward pass.
        model = nn.Sequential(
            nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Dropout(0.3), nn.Linear(16, 1)
        ).train()
        return Case(model, _mlp_batch(generator), mse)
    if kind == "noise":
        # torch.randn draws other numbers in float64 than in float32 at the same seed.
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), GaussianNoise(0.3), nn.Linear(16, 1)).train()
        return Case(model, _mlp_batch(generator), mse)
    raise ValueError(f"Expected one of {CLEAN_KINDS}. Received: {kind!r}")


CLEAN_KINDS = ("mlp", "cnn", "layer_norm", "attention", "embedding", "relu_padded", "relu", "train_mode", "noise")


def forgetful_dropout(seed=0, dropout=ForgetfulDropout):
    """An MLP whose dropout forgets its mask in the backward pass: ``body.0`` (below it) is wrong in training mode.

    With ``dropout=nn.Dropout`` the same MLP, correct.
    """
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1000)
    model = nn.Sequential()
    model.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), dropout(0.3))
    model.head = nn.Linear(16, 1)
    return Case(model.train(), _mlp_batch(generator), mse, ("body.0",))
