"""The float64 twin of a model whose code casts to float32 (as Hugging Face's upcasts do) is float64 throughout.

Models written for float16 and bfloat16 upcast where precision matters:
``logits.float()`` before the loss, ``.to(torch.float32)`` in an RMSNorm,
``softmax(..., dtype=torch.float32)``. In a float64 twin each would round
to float32, and the check would be float32's: its noise, its
inconclusive rows, a report that says float32.
"""

import pytest
import torch
from torch import nn

from tb_gradcheck.torch import check_gradients

torch.set_num_threads(1)


class Upcasting(nn.Module):
    """An RMSNorm, a softmax and a loss that upcast to float32 the way Hugging Face's modules do."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.scale = nn.Parameter(torch.ones(16))
        self.head = nn.Linear(16, 5)

    def forward(self, x, y):
        h = self.proj(x)
        wide = h.to(torch.float32)
        h = (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype) * self.scale
        h = h * nn.functional.softmax(h, dim=-1, dtype=torch.float32).to(h.dtype)
        return nn.functional.cross_entropy(self.head(h).float(), y)


def test_float32_casts_in_the_loss_are_float64_in_the_twin():
    torch.manual_seed(0)
    model = Upcasting()
    x, y = torch.randn(32, 8), torch.randint(0, 5, (32,))
    report = check_gradients(lambda net, b: net(*b), model, (x, y), dtype="float64", seed=0)
    # float64's noise on a loss near 1.6 is ~1e-16; float32's, which each cast would bring back, ~1e-7.
    assert report.dtype == "float64" and report.noise < 1e-12, (report.dtype, report.noise)
    assert report.ok and all(row.status == "ok" for row in report.rows), str(report)
    assert model.proj.weight.dtype == torch.float32  # the model itself is untouched


def test_a_hugging_face_causal_lm_twin_is_checked_in_float64():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    model = transformers.LlamaForCausalLM(config)
    ids = (torch.randint(0, 32, (2, 1)) + torch.arange(8)) % 32
    report = check_gradients(lambda net, b: net(input_ids=b, labels=b).loss, model, ids, dtype="float64", seed=0)
    assert report.dtype == "float64" and report.noise < 1e-12, (report.dtype, report.noise)
    assert all(row.status == "ok" for row in report.rows), str(report)
