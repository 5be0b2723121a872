"""Where the time goes inside forward and backward (torchspeed.profile.attribution): the share of
the ops torch.compile fuses (pointwise, normalization, softmax, pooling) in the model's operator
time, with the optimizer's ops left out, and compiled code recognised, on real profiled loops."""

import io

import torch
from torch import nn

from torchspeed.profile import _doctor
from torchspeed.profile import attribution as att_mod


class _Pointwise(nn.Module):
    """A small matmul, then a long chain of elementwise ops on a large activation."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(x).repeat(1, 2048)
        for _ in range(8):
            h = torch.tanh(h * 1.5 + 0.5)
        return h


def _profiled(model, x, opt, steps=6, loss=lambda out: out.square().mean()):
    with _doctor.doctor(out=None, progress=False, file=io.StringIO(), probe=False) as prof:
        for _ in range(steps):
            loss(model(x)).backward()
            opt.step()
            opt.zero_grad()
        facts = prof.facts()
    return facts.attribution, facts


def test_fusable_ops_classified_by_name():
    for name in ("aten::add", "aten::add_", "aten::gelu_backward", "aten::copy_", "aten::where"):
        assert att_mod.is_pointwise(name) and att_mod.is_fusable(name), name
    for name in ("aten::native_batch_norm", "aten::_log_softmax", "aten::max_pool2d_with_indices"):
        assert att_mod.is_fusable(name) and not att_mod.is_pointwise(name), name
    for name in ("aten::mm", "aten::addmm", "aten::mkldnn_convolution", "add", "aten::empty"):
        assert not att_mod.is_fusable(name), name


def test_a_pointwise_chain_is_most_of_the_model_op_time():
    torch.manual_seed(0)
    model = _Pointwise()
    att, _ = _profiled(model, torch.randn(64, 16), torch.optim.SGD(model.parameters(), lr=0.1))
    assert att is not None and att.model_op_s and att.model_op_s > 0
    assert att.fusable_share() > 0.5, att.format()
    names = [n for n, _ in att.fusable_top]
    assert any(n in ("aten::tanh", "aten::tanh_backward", "aten::mul", "aten::add") for n in names)
    assert not att.compiled
    assert "ops torch.compile fuses" in att.format()


def test_the_optimizers_pointwise_ops_are_not_the_models(monkeypatch):
    """A model of matmuls only (loss: a sum), stepped by a for-loop SGD with momentum (its mul_ /
    add_ are pointwise): none of the optimizer's ops is the model's, though the recorded step
    ends inside the optimizer's post hook with torch.optim's own range still open (the doctor's
    mark closes first; without it they read as the model's). Counted with the optimizer's ops
    (the control: its ranges ignored), they lead the pointwise ops. By name, not by time: one
    preemption on a loaded machine moves a share, never a name."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512, bias=False), nn.Linear(512, 256, bias=False))
    x = torch.randn(4, 256)

    def run():
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=False)
        att, _ = _profiled(model, x, opt, loss=lambda out: out.sum())
        return {n for n, _ in att.fusable_top}

    optimizer_ops = {"aten::add_", "aten::mul_"}
    assert not run() & optimizer_ops
    monkeypatch.setattr(att_mod, "NOT_MODEL_ROOTS", ("no such range",))
    assert run() & optimizer_ops


def test_a_compiled_model_is_recognised():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Pointwise()
    compiled = torch.compile(model, backend="eager")
    att, facts = _profiled(compiled, torch.randn(64, 16), torch.optim.SGD(model.parameters(), 0.1))
    assert facts.model_compiled
    torch._dynamo.reset()
    model.compile(backend="eager")  # in place: the global hooks see no eager root forward
    att, facts = _profiled(model, torch.randn(64, 16), torch.optim.SGD(model.parameters(), 0.1))
    assert att.compiled or facts.model_compiled, att.format()
    torch._dynamo.reset()
