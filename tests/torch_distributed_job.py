"""One training run for torch/test_distributed.py: on one process, or on 2 gloo processes under DDP or FSDP2.

    python tests/torch_distributed_job.py single|ddp|fsdp LOGDIR PORT

Every mode trains the same model from the same weights on the same batches:
each of the two ranks takes half of each batch, and the loss is a mean, so
the averaged gradient of the two ranks is the one process's gradient.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 5
BATCH = 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)  # rows sharded; units (columns) split across ranks' rows
        self.hidden = torch.nn.Linear(6, 7)  # 7 output units: 4 on rank 0, 3 on rank 1 under Shard(0)
        self.norm = torch.nn.LayerNorm(7)
        self.experts = Experts()  # 3 experts: 2 on rank 0, 1 on rank 1 under Shard(0)
        self.head = torch.nn.Linear(7, 3)

    def forward(self, tokens):
        return self.head(self.experts(self.norm(torch.relu(self.hidden(self.embed(tokens).mean(dim=1))))))


class Experts(torch.nn.Module):
    """Hugging Face's stacked experts layout, [experts, out, in] (``num_experts``, ``is_transposed=False``).

    Every expert takes every example (no routing: the test is of the units), and expert 1's output 2 is
    multiplied by 0: one dead unit of the 21 (expert, output) units, whose expert is sharded onto rank 1.
    """

    def __init__(self):
        super().__init__()
        self.num_experts, self.is_transposed = 3, False
        self.weight = torch.nn.Parameter(torch.randn(3, 7, 7) * 0.3)

    def forward(self, h):
        mask = torch.ones(3, 7)
        mask[1, 2] = 0.0
        return h + (torch.einsum("eoi,bi->beo", self.weight, h) * mask).mean(1)


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 11, (BATCH, 5), generator=g), torch.randn(BATCH, 3, generator=g)


def train(model, logdir, rank=0, world=1):
    from tb_gradcheck.torch import GradientWriter

    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    with GradientWriter(logdir, model, every_n_steps=2, optimizer=optimizer) as writer:
        for step in range(STEPS):
            tokens, target = batch(step)
            part = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(tokens[part]), target[part]).backward()
            writer.clip_grad_norm_(1.0)
            if step == 3:
                _plant_nan(model, rank)
            writer.write(step)
            optimizer.step()


def _plant_nan(model, rank):
    """A NaN in ``hidden.weight``'s gradient at [5, 0], on whichever rank holds that row (every rank under DDP)."""
    hidden = model.module.hidden if hasattr(model, "module") else model.hidden
    grad = hidden.weight.grad
    local = grad.to_local() if hasattr(grad, "to_local") else grad
    first = 0 if local.shape[0] == 7 else 4 * rank  # FSDP2's Shard(0) of 7 rows: 4 on rank 0, 3 on rank 1
    if first <= 5 < first + local.shape[0]:
        local[5 - first, 0] = float("nan")


def _rank(rank, mode, logdir, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Net()
    if mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for module in (model.embed, model.hidden, model.experts, model.head):
            fully_shard(module)
        fully_shard(model)
    train(model, logdir, rank, 2)
    dist.destroy_process_group()


def main(mode, logdir, port):
    if mode == "single":
        torch.manual_seed(0)
        train(Net(), logdir)
        return
    mp.spawn(_rank, args=(mode, logdir, port), nprocs=2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
