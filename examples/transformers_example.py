"""Hugging Face ``Trainer``: the Gradients tab beside the Trainer's scalars, from ``tb_gradcheck.transformers``.

A two-block GPT-2 built from its config (nothing is downloaded) learns
repeating token patterns with gradient accumulation and ``max_grad_norm``.
``GradientCallback`` writes, at every optimizer step, the gradient the
optimizer applied (accumulated and clipped) and the update each layer
received, into the run where the Trainer's ``TensorBoardCallback`` writes
``train/loss`` and ``train/grad_norm`` (``OUTPUT_DIR/runs/<date>_<host>``):

    python examples/transformers_example.py --output-dir logs/transformers
    tensorboard --logdir logs/transformers/runs

Rows are GPT-2's modules in forward order (``transformer.wte`` ...
``transformer.ln_f``; the tied ``lm_head`` is ``wte``'s row).
``--check-every N`` checks the analytic gradient against numeric ones every
N steps on one fixed batch, from inside ``train()`` (``GradientCheck``),
and writes the check into the same run (``callback.writer.write_check``):
the ``check_error`` heatmap.
"""

import argparse

import torch
import transformers

import tb_gradcheck.torch
import tb_gradcheck.transformers


def patterns(samples, length, vocab, seed):
    """Sequences that repeat a random 4-token motif: learnable by a tiny model in a few hundred steps."""
    g = torch.Generator().manual_seed(seed)
    motifs = torch.randint(0, vocab, (samples, 4), generator=g)
    ids = motifs.repeat(1, length // 4)
    return [{"input_ids": row, "labels": row} for row in ids]


class GradientCheck(transformers.TrainerCallback):
    """Every ``every`` optimizer steps, a gradient check on one fixed batch, written into the gradients' run."""

    def __init__(self, gradients, batch, every):
        self.gradients, self.batch, self.every = gradients, batch, every

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        step = state.global_step + 1  # the step this step's gradient rows are written at
        if step % self.every == 0:
            report = tb_gradcheck.torch.check_gradients(
                lambda net, ids: net(input_ids=ids, labels=ids).loss,
                model,
                self.batch,
                dtype="float64",
                seed=step,
            )
            self.gradients.writer.write_check(report, step)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", required=True, help="the Trainer's output_dir")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed for data and weights (default 0)")
    parser.add_argument("--check-every", type=int, default=0, help="gradient check every N steps (default 0: none)")
    args = parser.parse_args(argv)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(args.seed)
    model = transformers.GPT2LMHeadModel(config)
    callback = tb_gradcheck.transformers.GradientCallback()
    training = transformers.TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        max_grad_norm=1.0,
        learning_rate=3e-3,
        logging_steps=1,
        report_to=["tensorboard"],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
    )
    examples = patterns(512, 32, 128, args.seed)
    batch = torch.stack([e["input_ids"] for e in examples[:8]])
    checks = [GradientCheck(callback, batch, args.check_every)] if args.check_every else []
    trainer = transformers.Trainer(model=model, args=training, train_dataset=examples, callbacks=[callback, *checks])
    trainer.train()
    steps = trainer.state.global_step
    print(f"Wrote {steps} steps to {callback.log_dir}: tensorboard --logdir {args.output_dir}/runs, Gradients tab")


if __name__ == "__main__":
    main()
