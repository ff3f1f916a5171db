"""Runs whose per-layer gradient norms are set by hand, written by the real PyTorch writer and read back as the tab reads them."""

import math

import torch


def _module(paths, width):
    """A module holding a ``Linear(width, width)`` at each dotted path (the last ``Linear(width, 1)``), run in that order."""

    class Net(torch.nn.Module):
        def forward(self, x):
            for path in paths:
                x = self.get_submodule(path)(x)
            return x

    net = Net()
    for i, path in enumerate(paths):
        parent = net
        *scopes, leaf = path.split(".")
        for scope in scopes:
            if scope not in parent._modules:
                parent.add_module(scope, torch.nn.ModuleDict())
            parent = parent._modules[scope]
        parent.add_module(leaf, torch.nn.Linear(width, 1 if i == len(paths) - 1 else width))
    return net


class _Stepper(torch.optim.Optimizer):
    """An optimizer whose step adds ``updates(step, row)`` of each row parameter's norm, spread evenly over its elements.

    Added, as an optimizer's step is: a float32 element takes it where it
    is over half the element's ulp (a scaled tensor would round whole).
    """

    def __init__(self, net, paths, updates):
        super().__init__(net.parameters(), {})
        self._rows = [(p, list(net.get_submodule(p).parameters())) for p in paths]
        self._updates = updates
        self.step_count = 0

    @torch.no_grad()
    def step(self, closure=None):
        for path, params in self._rows:
            for w in params:
                w.add_(self._updates(self.step_count, path) * float(w.norm()) / math.sqrt(w.numel()))
        self.step_count += 1


def findings(run_dir, paths, norm, steps=100, weights=None, updates=None):
    """The findings of a run whose row ``p`` has gradient norm ``norm(step, p)`` at each step, written to ``run_dir``.

    Each row is a ``Linear`` (kernel and bias) at a dotted path, in depth
    order; its gradient is one constant per element, scaled to the norm.
    ``weights(step, p)``, when given, scales the row's initial weights at
    that step (what updates did to them). ``updates(step, p)``, when given,
    is the relative update an optimizer then applies to the row (the writer,
    given that optimizer, measures it as ``update_to_weight``). Returns
    ``queries.findings``.
    """
    from tb_gradcheck.reader import queries
    from tb_gradcheck.reader import store
    from tb_gradcheck.torch import GradientWriter

    torch.manual_seed(0)
    net = _module(paths, 8)
    start = {p: [w.detach().clone() for w in net.get_submodule(p).parameters()] for p in paths}
    optimizer = _Stepper(net, paths, updates) if updates else None
    with GradientWriter(str(run_dir), net, optimizer=optimizer) as writer:
        net(torch.zeros(1, 8))  # the rows' depth order
        for step in range(steps):
            for p in paths:
                params = list(net.get_submodule(p).parameters())
                size = sum(w.numel() for w in params)
                with torch.no_grad():
                    for w, w0 in zip(params, start[p]):
                        w.copy_(w0 * (weights(step, p) if weights else 1.0))
                        w.grad = torch.full_like(w, norm(step, p) / math.sqrt(size))
            writer.write(step)
            if optimizer is not None:
                optimizer.step()
    st, ctx, eid = store.local_store(str(run_dir.parent))
    return queries.findings(st, ctx, eid, run_dir.name)
