"""The PyTorch writer on models people train from libraries: Hugging Face ``transformers``' GPT-2 and BERT.

Real library models, tiny configurations: their rows (modules by path, in
the order they run, a tied ``lm_head`` counted once under the embedding it
shares) and GPT-2's ``Conv1D``, whose weight is ``[in, out]``: its units
are the last axis, so a dead MLP unit is found in the layer that has it.
"""

import numpy as np
import torch
import transformers

from tests.torch.test_writer import _rows

torch.set_num_threads(1)


def _gpt2(activation="gelu_new"):
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, activation_function=activation
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _train(model, batch, logdir, steps=2):
    from tb_gradcheck.torch import GradientWriter

    optimizer = torch.optim.AdamW(model.parameters(), 1e-3)
    writer = GradientWriter(str(logdir), model, optimizer=optimizer)
    for step in range(steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        grads = {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}
        writer.write(step)
        optimizer.step()
    writer.close()
    return grads


def _batch(vocab=64, labels=None):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (8, 12), generator=generator)
    return {"input_ids": ids, "labels": ids if labels is None else labels}


def test_gpt2_rows_are_its_modules_in_forward_order_with_the_tied_head_once(tmp_path):
    model = _gpt2()
    _train(model, _batch(), tmp_path)
    _, rows, _ = _rows(tmp_path, "layer")
    names = list(rows)
    assert names[:2] == ["transformer.wte", "transformer.wpe"]
    assert names[2:8] == [
        "transformer.h.0.ln_1",
        "transformer.h.0.attn.c_attn",
        "transformer.h.0.attn.c_proj",
        "transformer.h.0.ln_2",
        "transformer.h.0.mlp.c_fc",
        "transformer.h.0.mlp.c_proj",
    ]
    assert names[-1] == "transformer.ln_f"
    assert not any(n.startswith("lm_head") for n in names)  # tied to wte: one parameter, one row


def test_gpt2_conv1d_dead_units_are_its_outputs(tmp_path):
    """ReLU GPT-2 with 8 of c_fc's 128 outputs pushed far below zero: those units, and only in c_fc, are dead."""
    model = _gpt2("relu")
    dead = [3, 17, 40, 41, 77, 90, 100, 127]
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.bias[dead] = -1e4
    grads = _train(model, _batch(), tmp_path, steps=1)
    _, rows, _ = _rows(tmp_path, "layer")
    weight = grads["transformer.h.0.mlp.c_fc.weight"]  # [in, out]
    assert weight.shape == (32, 128)
    silent = sorted(np.flatnonzero((weight != 0).sum(0).numpy() == 0).tolist())
    assert silent == dead  # the premise: exactly the planted outputs get no gradient
    np.testing.assert_allclose(rows["transformer.h.0.mlp.c_fc"]["dead_unit_fraction"], len(dead) / 128)
    # Their zero inputs to c_proj are not c_proj's dead units: its 32 outputs all have gradients.
    assert rows["transformer.h.0.mlp.c_proj"]["dead_unit_fraction"] == 0.0
    _, variables, _ = _rows(tmp_path, "variable")  # each weight on its own: units are its outputs
    np.testing.assert_allclose(variables["transformer.h.0.mlp.c_fc.weight"]["dead_unit_fraction"], len(dead) / 128)
    assert variables["transformer.h.0.mlp.c_proj.weight"]["dead_unit_fraction"] == 0.0


def test_bert_classifier_rows_and_norms_match_the_gradients(tmp_path):
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=64
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    model.eval()  # no dropout: the recorded gradient is the one computed here
    grads = _train(model, _batch(labels=torch.tensor([0, 1] * 4)), tmp_path, steps=1)
    _, rows, _ = _rows(tmp_path, "layer")
    assert list(rows)[0] == "bert.embeddings.word_embeddings"
    assert list(rows)[-1] == "classifier"
    for layer in ("bert.encoder.layer.1.attention.self.query", "bert.pooler.dense", "classifier"):
        want = np.sqrt(sum(float((g**2).sum()) for n, g in grads.items() if n.rsplit(".", 1)[0] == layer))
        np.testing.assert_allclose(rows[layer]["grad_norm"], want, rtol=1e-5)


def test_t5_shared_table_is_a_row_under_the_embedding_that_runs_first_with_its_activation(tmp_path):
    """T5 ties ``shared`` (never called) to ``encoder/decoder.embed_tokens`` and ``lm_head``: one row, the encoder's.

    Under PyTorch's own name (``shared``) the row would sort last, after
    every module that ran, and its activation would be MISSING.
    """
    from tb_gradcheck.torch import GradientWriter

    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, decoder_start_token_id=0
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    model.train()
    # The premise: one table, four holders, the first registered never called.
    assert model.shared.weight is model.encoder.embed_tokens.weight is model.lm_head.weight
    batch = _batch()
    batch["labels"] = batch["labels"][:, :5].contiguous()
    embedded = []
    model.encoder.embed_tokens.register_forward_hook(lambda m, a, out: embedded.append(out.detach().double()))
    writer = GradientWriter(str(tmp_path), model, activations=True)
    torch.manual_seed(1)
    model(**batch).loss.backward()
    grad = model.shared.weight.grad.detach().double()
    writer.write(0)
    writer.close()
    _, rows, _ = _rows(tmp_path, "layer")
    names = list(rows)
    assert names[0] == "encoder.embed_tokens"
    assert not {"shared", "decoder.embed_tokens", "lm_head"} & set(names)
    _, variables, _ = _rows(tmp_path, "variable")
    np.testing.assert_allclose(variables["encoder.embed_tokens.weight"]["grad_norm"], grad.norm().item(), rtol=1e-5)
    (out,) = embedded  # the encoder's call only: the decoder's and the head's are other rows' business
    np.testing.assert_allclose(rows["encoder.embed_tokens"]["act_rms"], out.pow(2).mean().sqrt().item(), rtol=1e-5)
    np.testing.assert_allclose(rows["encoder.embed_tokens"]["act_max_abs"], out.abs().max().item(), rtol=1e-5)


def test_mixtral_stacked_experts_units_are_each_experts_outputs(tmp_path):
    """A ReLU Mixtral whose expert 0 has 5 gate rows at zero: those outputs of expert 0, and only they, are dead.

    The experts' weights are stacked ``[experts, out, in]``; counted by expert
    (the first axis), expert 0 is alive (its other outputs get gradients)
    and the dead outputs inside it were never seen.
    """
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=16,
        hidden_act="relu",
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config)
    experts = model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.shape == (4, 96, 32)  # [experts, gate and up outputs, in]
    dead = [2, 7, 11, 30, 47]
    with torch.no_grad():
        experts.gate_up_proj[0, dead] = 0.0  # relu(0) = 0 passes no gradient, and its up output is multiplied by 0
    grads = _train(model, _batch(), tmp_path, steps=1)
    gate_up = grads["model.layers.0.mlp.experts.gate_up_proj"]
    silent = (gate_up.abs().amax(dim=2) == 0).nonzero().tolist()
    # The premise: every expert was routed to, and exactly the planted gate rows and their up rows are silent.
    assert silent == [[0, i] for i in dead] + [[0, 48 + i] for i in dead]
    _, variables, _ = _rows(tmp_path, "variable")
    row = variables["model.layers.0.mlp.experts.gate_up_proj"]
    np.testing.assert_allclose(row["dead_unit_fraction"], 2 * len(dead) / (4 * 96))
    # down_proj's units are its outputs [experts, hidden]: the zero inputs from expert 0's dead units kill none.
    assert variables["model.layers.0.mlp.experts.down_proj"]["dead_unit_fraction"] == 0.0
