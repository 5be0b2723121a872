"""TorchHooks (StepProfiler(hooks=True)): every way out of a profiled block removes every hook and
patch, and a forward or optimizer step that raises leaves no phase open."""

import time

import pytest
import torch
from profile_helpers import (
    ORIG,
    P,
    _assert_hooks_removed,
    _model,
    _train_step,
)
from torch import nn
from torch.nn.modules import module as mm

import torchspeed.profile as tsp

# ---- hooks: every way out removes them ----------------------------------------------------------


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_inside_with_prof_removes_every_hook(exc):
    P.set_enabled(False)
    m, opt = _model()
    prof = tsp.StepProfiler(device="cpu", hooks=True)
    with pytest.raises(type(exc)) as info:
        with prof:
            assert torch.autograd.backward is not ORIG[(id(torch.autograd), "backward")]
            assert mm._global_forward_pre_hooks
            _train_step(m, opt)
            prof.step()
            with tsp.phase("forward", "open_at_raise"):
                raise exc
    assert info.value is exc
    _assert_hooks_removed()
    assert P.enabled() is False
    assert P.end() is False
    _train_step(m, opt)  # plain torch still works


def test_h2d_patches_pass_non_copies_through_and_are_removed(monkeypatch):
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: True
    )  # installs the Tensor.to/.cuda patches
    prof = tsp.StepProfiler(device="cpu", hooks=True)
    x = torch.ones(3)
    with prof:
        assert torch.Tensor.to is not ORIG[(id(torch.Tensor), "to")]
        assert x.to(torch.float64).dtype == torch.float64
        assert x.to("cpu").device.type == "cpu"
        assert x.to(torch.ones(1, dtype=torch.int32)).dtype == torch.int32
        assert x.to(dtype=torch.float16, copy=True).dtype == torch.float16
        with pytest.raises(TypeError):
            x.to(object())  # torch's own error
    _assert_hooks_removed()


def test_hook_removal_leaves_no_shadowing_class_attributes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = {n: n in torch.Tensor.__dict__ for n in ("to", "cuda")}
    with tsp.StepProfiler(device="cpu", hooks=True):
        pass
    assert {n: n in torch.Tensor.__dict__ for n in ("to", "cuda")} == before


class _FailingModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 2)
        self.fail = False

    def forward(self, x):
        x = self.inner(x)
        if self.fail:
            raise RuntimeError("forward failed")
        return self.head(x)


def test_forward_that_raises_does_not_leak_the_phase_stack():
    m = _FailingModel()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    prof = tsp.StepProfiler(device="cpu", hooks=True, warmup=0)
    with prof:
        for i in range(8):  # fails in discovery (1) and after it (5)
            m.fail = i in (1, 5)
            try:
                _train_step(m, opt)
            except RuntimeError:
                pass
            with tsp.phase("data_wait"):
                time.sleep(0.003)
            prof.step()
        assert prof._hooks.depth == 0
    assert P.end() is False
    h = prof.history()
    for i in range(len(h)):
        assert sum(h.phase_ns[p][i] for p in tsp.PHASES) == h.step_ns[i]
        assert h.phase_ns["data_wait"][i] >= 2.5e6  # never swallowed by a leaked forward
        assert h.phase_ns["forward"][i] < h.step_ns[i] / 2
    assert h.phase_ns["backward"][1] == 0 and h.phase_ns["backward"][5] == 0


def test_optimizer_step_that_raises_does_not_leak_the_optimizer_phase():
    m, opt = _model()

    def bad_closure():
        raise RuntimeError("closure failed")

    prof = tsp.StepProfiler(device="cpu", hooks=True, warmup=0)
    with prof:
        prof.step()
        with tsp.phase("forward", "user_forward"):
            with pytest.raises(RuntimeError):
                opt.step(bad_closure)
            time.sleep(0.02)
        prof.step()
    h = prof.history()
    assert h.phase_ns["optimizer"][-1] < 5e6
    assert h.phase_ns["forward"][-1] >= 15e6
    assert P.end() is False


def test_optimizer_step_inside_a_forward_does_not_leak_a_forward_phase():
    class Trainer(nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.opt = _model()

        def forward(self, x):
            loss = self.model(x).sum()
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            return loss

    t = Trainer()
    prof = tsp.StepProfiler(device="cpu", hooks=True, step_on="optimizer")
    with prof:
        for _ in range(6):
            t(torch.randn(8, 4))
    assert prof.steps == 6
    assert P.end() is False
