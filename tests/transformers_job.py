"""A tiny GPT-2 trained by ``transformers.Trainer`` with ``tb_gradcheck.transformers.GradientCallback``, and its record.

    python -m torch.distributed.run --nproc_per_node=2 tests/transformers_job.py OUTPUT_DIR RECORD_DIR

test_transformers.py imports ``train`` and runs it in its own process; run
as above, it trains under DDP on 2 gloo processes (``accelerate``'s
MULTI_CPU), each rank saving its record to ``RECORD_DIR/rank<r>.npz``.

The record is the test side's only: the optimizer's step hooks (the
Trainer's ``AdamW``, made here and handed to it) take the float64 norm of
each gradient after the step (what it applied: AdamW does not change
``.grad``, and the Trainer zeroes it after the step) and of each weight's
change.
"""

import os
import sys
import types

if __name__ == "__main__":
    # TensorBoard's SummaryWriter (the Trainer's TensorBoardCallback) imports TensorFlow where it is installed:
    # 20 s per process on a busy machine. TensorBoard takes its stub when this module imports, as without TF.
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import tb_gradcheck.transformers  # noqa: E402

SAMPLES = 16
BATCH = 2
ACCUMULATE = 2
CLIP = 0.05  # binds at every step: the total norm is ~1.5


def model():
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def data():
    ids = torch.randint(0, 64, (SAMPLES, 8), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


class Record:
    """Float64 norms of what each optimizer step applied, by the step the Trainer gives it (1, 2, ...)."""

    def __init__(self, net, optimizer):
        self.names = [n for n, _ in net.named_parameters()]
        self._params = list(net.parameters())
        self.applied, self.update = {}, {}
        self._weights = None
        optimizer.register_step_pre_hook(self._before)
        optimizer.register_step_post_hook(self._after)

    def _before(self, optimizer, args, kwargs):
        self._weights = [p.detach().double().clone() for p in self._params]

    def _after(self, optimizer, args, kwargs):
        step = len(self.applied) + 1
        self.applied[step] = _norms(p.grad for p in self._params)
        self.update[step] = _norms(p.detach().double() - w for p, w in zip(self._params, self._weights))


def _norms(tensors):
    return np.array([np.linalg.norm(t.detach().double().cpu().numpy().ravel()) for t in tensors])


def train(output_dir, callback=None, before_train=None, **overrides):
    """Trains the tiny GPT-2 for one epoch; returns (record, callback, trainer). ``before_train()`` runs between the two."""
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.1)
    record = Record(net, optimizer)
    callback = callback or tb_gradcheck.transformers.GradientCallback()
    options = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        max_grad_norm=CLIP,
        num_train_epochs=1,
        logging_steps=1,
        report_to=["tensorboard"],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        lr_scheduler_type="constant",
    )
    options.update(overrides)
    args = transformers.TrainingArguments(**options)
    trainer = transformers.Trainer(
        model=net, args=args, train_dataset=data(), optimizers=(optimizer, None), callbacks=[callback]
    )
    if before_train is not None:
        before_train()
    trainer.train()
    return record, callback, trainer


if __name__ == "__main__":
    output_dir, record_dir = sys.argv[1:3]
    torch.set_num_threads(1)
    record, callback, trainer = train(output_dir, ddp_backend="gloo")
    steps = sorted(record.applied)
    np.savez(
        os.path.join(record_dir, f"rank{trainer.args.process_index}.npz"),
        steps=np.array(steps),
        applied=np.stack([record.applied[s] for s in steps]),
        update=np.stack([record.update[s] for s in steps]),
        names=np.array(record.names),
        log_dir=np.array(str(callback.log_dir)),
        world=np.array(trainer.args.world_size),
    )
    # Torn down before the interpreter exits: gloo's threads destroyed at exit
    # abort a rank now and then ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # both ranks done with every collective before the group goes
        torch.distributed.destroy_process_group()
