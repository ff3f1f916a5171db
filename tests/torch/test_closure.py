"""tb_gradcheck.torch.closure.ClosureFirst: the closure runs once, before the hooks after it, and the step is unchanged."""

import pytest
import torch

from tb_gradcheck.torch import closure

torch.set_num_threads(1)


def _model_and_closure(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    calls = []

    def loss_closure():
        calls.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    return model, loss_closure, calls


@pytest.mark.parametrize("by_keyword", [True, False])
def test_the_closure_runs_once_before_later_hooks_and_the_step_is_a_plain_steps(by_keyword):
    model, loss_closure, calls = _model_and_closure()
    twin, twin_closure, _ = _model_and_closure()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    plain = torch.optim.Adam(twin.parameters(), lr=0.1)
    first = closure.ClosureFirst(optimizer)
    seen = []
    optimizer.register_step_pre_hook(lambda o, a, k: seen.append([p.grad.clone() for p in model.parameters()]))
    for _ in range(3):
        loss = optimizer.step(closure=loss_closure) if by_keyword else optimizer.step(loss_closure)
        torch.testing.assert_close(loss, plain.step(twin_closure), rtol=0, atol=0)
    assert len(calls) == 3  # once per step
    # The later pre-hook saw this step's gradients, which the closure (backward) had just made: those the next
    # closure found on entry, not those this one found.
    for step in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(seen[step - 1], calls[step]))
        assert all(not torch.equal(a, b) for a, b in zip(seen[step], calls[step]))
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    first.remove()
    optimizer.step(loss_closure)
    assert len(calls) == 4


def test_a_step_without_a_closure_is_left_alone():
    model, loss_closure, _ = _model_and_closure()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    closure.ClosureFirst(optimizer)
    loss_closure()
    assert optimizer.step() is None


def test_optimizers_that_may_call_the_closure_again_are_refused():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert closure.calls_closure_once(torch.optim.SGD(params, lr=0.1))
    assert not closure.calls_closure_once(torch.optim.LBFGS(params))

    class Mine(torch.optim.SGD):
        pass

    assert not closure.calls_closure_once(Mine(params, lr=0.1))
    with pytest.raises(ValueError, match="Expected an optimizer that calls its closure once.*Received: LBFGS"):
        closure.ClosureFirst(torch.optim.LBFGS(params))
