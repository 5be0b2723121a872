"""torchspeed.dist.AccumulatingDDP (torchspeed/dist/ddp.py): argument checks and world-size-one
behaviour in this process, and 2 and 4 Gloo processes on 127.0.0.1 against single-process training
(dist_worker.py runs the ranks; each launch is bounded in time and leaves no process behind)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from dist_helpers import (
    DIST_MISSING,
    F32,
    F64,
    HERE,
    Net,
    assert_all_ok,
    case_reference,
    free_port,
    large_batch_reference,
    launch,
    reference,
    token_reference,
    window_data,
)
from torch import nn

from torchspeed.dist import AccumulatingDDP

pytestmark = pytest.mark.skipif(DIST_MISSING is not None, reason=str(DIST_MISSING))

# ---- AccumulatingDDP: construction errors (one process, world size 1) ---------------------------


@pytest.fixture
def single_group(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    pg = dist.ProcessGroupGloo(store, 0, 1)
    return pg


def test_wrapper_validates_its_arguments(single_group):
    net = Net()
    with pytest.raises(ValueError, match="accumulation_steps must be >= 1, got 0"):
        AccumulatingDDP(net, accumulation_steps=0, process_group=single_group)
    with pytest.raises(TypeError, match="accumulation_steps must be an int"):
        AccumulatingDDP(net, accumulation_steps=2.0, process_group=single_group)
    with pytest.raises(ValueError, match="compression must be None, 'bf16' or 'fp16'"):
        AccumulatingDDP(net, compression="int8", process_group=single_group)
    with pytest.raises(ValueError, match="bucket_cap_mb must be finite and > 0, got 0"):
        AccumulatingDDP(net, bucket_cap_mb=0, process_group=single_group)
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        AccumulatingDDP(lambda x: x, process_group=single_group)


BAD_ARGUMENTS = [
    # (keyword arguments, exception, message): issue 23 item 24 and the adversarial pass.
    (dict(accumulation_steps=-3), ValueError, "accumulation_steps must be >= 1, got -3"),
    (dict(accumulation_steps=2**70), ValueError, "accumulation_steps must be < 2\\*\\*63"),
    (dict(accumulation_steps=True), TypeError, "accumulation_steps must be an int"),
    (dict(accumulation_steps="2"), TypeError, "accumulation_steps must be an int"),
    (dict(bucket_cap_mb=0), ValueError, "bucket_cap_mb must be finite and > 0, got 0"),
    (dict(bucket_cap_mb=-1.0), ValueError, "bucket_cap_mb must be finite and > 0"),
    (dict(bucket_cap_mb=float("nan")), ValueError, "bucket_cap_mb must be finite and > 0"),
    (dict(bucket_cap_mb=float("inf")), ValueError, "bucket_cap_mb must be finite and > 0"),
    (dict(bucket_cap_mb="25"), TypeError, "bucket_cap_mb must be a number"),
    (dict(bucket_cap_mb=True), TypeError, "bucket_cap_mb must be a number"),
    (dict(first_bucket_cap_mb=0.0), ValueError, "first_bucket_cap_mb must be finite and > 0"),
    (dict(first_bucket_cap_mb=None), TypeError, "first_bucket_cap_mb must be a number"),
    (dict(compression=["bf16"]), TypeError, "compression must be None, a str or a torch.dtype"),
    (dict(compression=torch.int8), ValueError, "compression must be None, 'bf16' or 'fp16'"),
    (dict(find_unused_parameters="yes"), TypeError, "find_unused_parameters must be a bool"),
    (dict(broadcast_buffers=1), TypeError, "broadcast_buffers must be a bool"),
    (dict(static_graph=None), TypeError, "static_graph must be a bool"),
    (dict(device_ids="cpu"), TypeError, "device_ids must be a list"),
    (dict(device_ids=["bogus"]), ValueError, "device_ids must name devices"),
    (dict(device_ids=["meta"]), ValueError, "do not hold the module's params"),
]


@pytest.mark.parametrize("kwargs,error,match", BAD_ARGUMENTS, ids=lambda v: str(v)[:40])
def test_bad_arguments_raise_torchs_exception_types_before_any_change(
    single_group, kwargs, error, match
):
    net = Net()
    before = {n: p.clone() for n, p in net.state_dict().items()}
    with pytest.raises(error, match=match):
        AccumulatingDDP(net, process_group=single_group, **kwargs)
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(before[n], p) for n, p in net.state_dict().items())


def test_a_huge_bucket_cap_means_one_bucket_per_dtype(single_group):
    model = AccumulatingDDP(
        Net(), process_group=single_group, bucket_cap_mb=1e300, first_bucket_cap_mb=1e300
    )
    assert model.stats()["buckets"] == 1


def test_clip_grad_norm_follows_torch_for_zero_and_inf(single_group):
    """Issue 23 item 24: torch's clip_grad_norm_(..., 0) zeroes the grads and returns the norm;
    inf measures only. Negative (torch flips the sign) and NaN raise ValueError, a bad type
    TypeError, with the grads untouched."""
    model = AccumulatingDDP(Net(), process_group=single_group)
    x, y = window_data(0, 1, 1, 4, torch.float64)
    nn.functional.mse_loss(model(x[0, 0], use_side=True), y[0, 0]).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    want = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    for bad, error in (
        (-1.0, ValueError),
        (float("nan"), ValueError),
        ("1", TypeError),
        (True, TypeError),
        (None, TypeError),
    ):
        with pytest.raises(error, match="max_norm must be"):
            model.clip_grad_norm_(bad)
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    norm = model.clip_grad_norm_(float("inf"))
    torch.testing.assert_close(norm.double(), want, rtol=1e-6, atol=0)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    norm = model.clip_grad_norm_(0)
    copies = [g.clone().requires_grad_() for g in grads]
    for c, g in zip(copies, grads):
        c.grad = g.clone()
    torch_norm = torch.nn.utils.clip_grad_norm_(copies, 0)
    torch.testing.assert_close(norm.double(), torch_norm, rtol=1e-6, atol=0)
    for p, c in zip(model.parameters(), copies):
        assert torch.equal(p.grad, c.grad) and not p.grad.any()


def test_methods_refuse_bad_types_and_values(single_group):
    model = AccumulatingDDP(Net(), process_group=single_group)
    what = "global_mean_factor: count must be"
    for bad, error in (
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (-2, ValueError),
        ("3", TypeError),
        (None, TypeError),
    ):
        with pytest.raises(error, match=what):
            model.global_mean_factor(bad)
    assert model.global_mean_factor(torch.tensor(8)) == pytest.approx(0.125)
    with pytest.raises(TypeError, match="micro_batch: sync must be a bool"):
        with model.micro_batch(sync="no"):
            pass
    with pytest.raises(TypeError, match="join: throw_on_early_termination must be a bool"):
        with model.join(throw_on_early_termination=1):
            pass
    with pytest.raises(TypeError, match="zero_grad: set_to_none must be a bool"):
        model.zero_grad(set_to_none=None)
    assert model.micro_step == 0 and model.stats()["micro_steps"] == 0


def test_methods_validate_their_arguments(single_group):
    with pytest.raises(TypeError, match="process_group must be a torch.distributed ProcessGroup"):
        AccumulatingDDP(Net(), process_group="gloo")
    model = AccumulatingDDP(Net(), process_group=single_group)
    with pytest.raises(ValueError, match="max_norm must be >= 0, got -0.5"):
        model.clip_grad_norm_(-0.5)
    with pytest.raises(ValueError, match="count must be finite"):
        model.global_mean_factor(float("nan"))
    with pytest.raises(ValueError, match="count summed over the ranks must be > 0, got 0"):
        model.global_mean_factor(0)
    assert model.global_mean_factor(4) == pytest.approx(0.25)
    with pytest.raises(RuntimeError, match="call join_begin"):
        model._impl.join()


def test_a_backward_without_a_forward_counts_as_the_next_micro_step(single_group):
    """A micro-step is one backward: a second backward of the synchronising micro-step's graph
    (retain_graph) does not reduce again, it accumulates as the first micro-step of the next
    window, and sync_now then follows the shorter remaining window."""
    model = AccumulatingDDP(Net(), accumulation_steps=2, process_group=single_group)
    x = torch.randn(3, 8, dtype=torch.float64)
    model(x, use_side=True).sum().backward()
    out = model(x, use_side=True).sum()
    assert model.sync_now
    out.backward(retain_graph=True)
    reduced = model.stats()["bucket_collectives"]
    assert reduced == model.stats()["buckets"]
    out.backward()  # no new forward
    assert model.stats()["bucket_collectives"] == reduced and model.micro_step == 1
    model(x, use_side=True).sum().backward()
    assert model.sync_now and model.stats()["sync_steps"] == 2


class _ConvNet(nn.Module):
    """Conv (channels_last), BatchNorm (buffers), a float64 head: several dtypes and layouts."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 2).double()

    def forward(self, x):
        h = self.bn(self.conv(x)).relu().mean(dim=(2, 3))
        return self.head(h.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layouts_dtypes_and_buffers_match_plain_training_exactly(single_group, dtype):
    """World size 1 (1/world = 1): the reducer must not change a single bit of the gradients,
    with a channels_last conv weight (its bucket view keeps the param's strides), bf16 or fp32
    convs next to a float64 head (one bucket per dtype), BatchNorm buffers broadcast at each
    synchronising forward, and bf16 compression (a no-op on bf16 buckets)."""
    plain, wrapped = _ConvNet(), _ConvNet()
    for m in (plain, wrapped):
        m.conv.to(dtype)
        m.bn.to(dtype)
    model = AccumulatingDDP(
        wrapped, accumulation_steps=2, process_group=single_group, compression="bf16"
    )
    assert model.module.conv.weight.grad is None  # grads stay None until the first backward
    g = torch.Generator().manual_seed(1)
    for _step in range(2):
        for _micro in range(2):
            x = torch.randn(4, 3, 9, 9, generator=g).to(dtype).to(memory_format=torch.channels_last)
            for m in (plain, model):
                m(x).sum().div(2).backward()
        controls = model.stats()["control_collectives"]
        for (n, a), b in zip(plain.named_parameters(), wrapped.parameters()):
            # fp32 buckets travel in bf16 (rounded once, to nearest even); the others unchanged
            want = a.grad.to(torch.bfloat16).float() if a.dtype == torch.float32 else a.grad
            assert torch.equal(b.grad, want), n
            assert b.grad.stride() == b.stride(), n  # the param's own layout
        for m in (plain, wrapped):
            for p in m.parameters():
                p.grad = None
    st = model.stats()
    assert st["buckets"] >= 2  # the float64 head has its own bucket
    assert controls >= 2  # construction broadcast(s) + the buffer broadcasts
    wire = sum(
        p.numel() * p.element_size() for p in wrapped.parameters() if p.dtype != torch.float32
    )
    wire += sum(p.numel() * 2 for p in wrapped.parameters() if p.dtype == torch.float32)
    assert st["last_bytes_reduced"] == wire  # fp32 buckets travel in bf16, the others as they are


def test_reentrant_checkpoint_is_refused_with_the_fix(single_group):
    """torch.utils.checkpoint(use_reentrant=True) runs a nested backward that would end the
    reduction early: a clear error names the supported form; use_reentrant=False works."""
    import torch.utils.checkpoint as cp

    class Checkpointed(nn.Module):
        def __init__(self, reentrant):
            super().__init__()
            self.inner, self.outer, self.reentrant = nn.Linear(8, 8), nn.Linear(8, 2), reentrant

        def forward(self, x):
            return self.outer(cp.checkpoint(self.inner, x, use_reentrant=self.reentrant))

    x = torch.randn(4, 8, requires_grad=True)
    model = AccumulatingDDP(Checkpointed(False), process_group=single_group)
    model(x).sum().backward()
    assert model.stats()["sync_steps"] == 1
    model = AccumulatingDDP(Checkpointed(True), process_group=single_group)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        model(x).sum().backward()


def test_wrapper_needs_a_process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        AccumulatingDDP(Net())


def test_world_size_one_equals_plain_training(single_group):
    """One rank: the wrapper must not change the math (the average over one rank is the sum)."""
    k, steps = 3, 2
    model = AccumulatingDDP(
        Net(),
        accumulation_steps=k,
        process_group=single_group,
        bucket_cap_mb=0.004,
        first_bucket_cap_mb=0.001,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = window_data(step, 1, k, 4, torch.float64)
        for j in range(k):
            nn.functional.mse_loss(model(x[0, j], use_side=True), y[0, j]).div(k).backward()
        assert model.sync_now and model.micro_step == 0
        opt.step()
        opt.zero_grad()
    ref = reference("plain", 1, k, steps, 4, torch.float64, "sgd")
    for n, p in model.module.named_parameters():
        torch.testing.assert_close(p.detach(), ref[n], **F64)
    # The grads are views into the buckets: accumulation adds in place, no copy.
    buckets = model.buckets()
    model.zero_grad(set_to_none=False)
    for p in model.parameters():
        assert any(
            p.grad.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in buckets
        )


def test_the_exposed_wait_is_the_comm_phase_of_the_step_profiler(single_group):
    """The reducer's wait after backward is recorded as the "comm" phase on torchspeed's clock, so
    StepProfiler's breakdown (and the doctor) sees communication separately from backward."""
    import torchspeed.profile as tsp

    model = AccumulatingDDP(Net(), accumulation_steps=2, process_group=single_group)
    x, y = window_data(0, 1, 2, 64, torch.float64)
    with tsp.StepProfiler() as prof:
        for _ in range(6):
            for j in range(2):
                with tsp.phase("forward"):
                    loss = nn.functional.mse_loss(model(x[0, j]), y[0, j])
                with tsp.phase("backward"):
                    loss.backward()
            prof.step()
    s = prof.summary()
    assert s.phases["comm"].total_s > 0, s.phases
    # The phase is the reducer's wait, which its stats time on the same clock as part of the
    # exposed communication (the summary may leave warm-up steps out, never add time).
    exposed_s = model.stats()["exposed_ns"] / 1e9
    assert 0 < s.phases["comm"].total_s <= exposed_s * 1.01 + 1e-5, (s.phases["comm"], exposed_s)


# ---- AccumulatingDDP on 2 and 4 processes ---------------------------------------------------------


@pytest.fixture(scope="module")
def main2(tmp_path_factory):
    records = launch(2, "main", tmp_path_factory.mktemp("dist_main2"))
    assert_all_ok(records)
    return records


@pytest.fixture(scope="module")
def main4(tmp_path_factory):
    records = launch(4, "main4", tmp_path_factory.mktemp("dist_main4"))
    assert_all_ok(records)
    return records


def _params_equal_on_every_rank(records, case, ref, tol):
    for r in records:
        got = r["pt"][case]["params"]
        for n, want in ref.items():
            where = f"rank {r['rank']} {case} {n}"
            torch.testing.assert_close(
                got[n], want, **tol, msg=lambda m, where=where: f"{where}: {m}"
            )


@pytest.mark.parametrize("world", [2, 4])
def test_params_equal_single_process_large_batch_float64(world, main2, main4):
    records = main2 if world == 2 else main4
    ref = case_reference("f64_sgd", world)
    _params_equal_on_every_rank(records, "f64_sgd", ref, F64)
    # and the chunked reference is large-batch training itself
    big = large_batch_reference(world, 3, 3, 4, torch.float64, "sgd")
    for n in ref:
        torch.testing.assert_close(ref[n], big[n], **F64)


@pytest.mark.parametrize("world", [2, 4])
def test_params_equal_single_process_float32_with_torchspeed_adamw(world, main2, main4):
    records = main2 if world == 2 else main4
    ref = case_reference("f32_ts_adamw", world)
    _params_equal_on_every_rank(records, "f32_ts_adamw", ref, F32)


@pytest.mark.parametrize("case", ["f64_no_sync", "f64_micro_batch"])
def test_torch_style_no_sync_and_the_context_manager_give_the_same_result(main2, case):
    ref = case_reference(case, 2)
    _params_equal_on_every_rank(main2, case, ref, F64)


@pytest.mark.parametrize("case", ["f64_sgd", "f64_no_sync", "f32_none", "unused_sgd"])
def test_zero_collectives_while_accumulating_one_per_bucket_on_sync(main2, case):
    for r in main2:
        res = r["pt"][case]
        buckets = res["stats"]["buckets"]
        assert buckets >= 3, "the test's small bucket cap must give several buckets"
        for m in res["micro"]:
            if not m["sync_now"]:
                assert m["collectives"] == 0, m  # counted by Gloo itself
            else:
                assert m["bucket_collectives"] == buckets, m
                vote = 1 if case.startswith("unused") else 0  # find_unused_parameters' vote
                assert m["collectives"] == buckets + vote, m


@pytest.mark.parametrize(
    "case,ratio", [("f32_none", 1.0), ("f32_bf16", 0.5), ("f32_fp16", 0.5), ("f64_sgd", 1.0)]
)
def test_bytes_reduced_per_step_equal_gradient_bytes(main2, case, ratio):
    for r in main2:
        res = r["pt"][case]
        grad_bytes = sum(p.numel() * p.element_size() for p in res["params"].values())
        assert res["stats"]["bucket_bytes"] == grad_bytes
        for m in res["micro"]:
            if m["sync_now"]:
                assert m["bytes"] == int(grad_bytes * ratio)
        assert res["stats"]["bytes_reduced"] == int(grad_bytes * ratio) * res["stats"]["sync_steps"]


@pytest.mark.parametrize("case", ["f32_bf16", "f32_fp16"])
def test_compression_stays_close_and_really_compresses(main2, case):
    ref = case_reference("f32_none", 2)
    exact = main2[0]["pt"]["f32_none"]["params"]
    got = main2[0]["pt"][case]["params"]
    _params_equal_on_every_rank(main2, "f32_none", ref, F32)
    # bf16 keeps 8 bits of mantissa: after 3 SGD steps the params move by < 1e-2 relative.
    tol = dict(rtol=2e-2, atol=2e-3) if case == "f32_bf16" else dict(rtol=2e-3, atol=2e-4)
    differs = False
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], **tol)
        differs |= not torch.equal(got[n], exact[n])
    assert differs, "compressed and uncompressed training gave identical params: no compression?"
    assert torch.equal(
        main2[0]["pt"][case]["params"]["l1.weight"], main2[1]["pt"][case]["params"]["l1.weight"]
    )


@pytest.mark.parametrize("case", ["unused_sgd", "unused_adamw"])
def test_params_unused_in_some_micro_steps_get_correct_gradients(main2, case):
    """pytorch#69031: a param used only in a non-synchronising micro-step (and, in step 1, by no
    rank at all) must be reduced with what it accumulated, and left alone when nobody used it."""
    ref = case_reference(case, 2)
    _params_equal_on_every_rank(main2, case, ref, F64)


def test_unused_param_without_find_unused_still_correct_in_its_window(main2):
    ref = case_reference("unused_no_find", 2)
    _params_equal_on_every_rank(main2, "unused_no_find", ref, F64)


def test_find_unused_leaves_grads_of_params_no_rank_used_none(main2):
    facts = main2[0]["json"]["unused_grads"]
    assert facts["none"]["side.weight"] and facts["none"]["side.bias"]
    assert not any(v for n, v in facts["none"].items() if not n.startswith("side"))
    assert facts["plain_side_grad_is_zero"]


def test_grad_scaler_and_clipping_once_at_the_boundary(main2):
    ref = case_reference("f32_scaler_clip", 2)
    _params_equal_on_every_rank(main2, "f32_scaler_clip", ref, F32)
    unclipped = reference("plain", 2, 2, 3, 4, torch.float32, "sgd", scaler=True)
    assert not torch.allclose(ref["l1.weight"], unclipped["l1.weight"]), "clipping must bite here"


def test_loss_normalisation_over_variable_length_batches(main2):
    ref = token_reference(2, 3, 3, 4)
    _params_equal_on_every_rank(main2, "tokens", ref, F64)
    for r in main2:
        assert r["pt"]["tokens"]["controls"] == [1, 1, 1]  # one small all-reduce per window


def test_state_dict_has_plain_keys_and_loads_both_forms(main2):
    facts = main2[0]["json"]["state_dict"]
    assert facts["keys"] == sorted(Net().state_dict().keys())
    assert facts["ok_prefixed"] and facts["ok_plain"]


def test_overlap_is_reported(main2):
    for r in main2:
        st = r["pt"]["f64_sgd"]["stats"]
        assert st["sync_steps"] == 3 and st["micro_steps"] == 9
        assert st["comm_ns"] > 0 and 0.0 <= st["last_overlap"] <= 1.0
        assert st["exposed_ns"] <= st["comm_ns"]


def test_a_param_frozen_after_wrapping_keeps_grad_none_and_does_not_move(main2):
    """Issue 23 item 3: l1.weight frozen (requires_grad_(False)) on every rank after step 0 of 3,
    AdamW with weight decay: its .grad stays None, so it keeps its value, and every param equals
    the single-process run frozen at the same step (a zero .grad moved it by weight decay)."""
    ref = case_reference("frozen_adamw", 2)
    _params_equal_on_every_rank(main2, "frozen_adamw", ref, F64)
    after_step0 = reference("plain", 2, 2, 1, 4, torch.float64, "adamw")["l1.weight"]
    for r in main2:
        res = r["pt"]["frozen_adamw"]
        assert res["grad_is_none"]["l1.weight"] and not res["grad_is_none"]["l1.bias"]
        torch.testing.assert_close(res["params"]["l1.weight"], after_step0, **F64)


@pytest.fixture(scope="module")
def hardening2(tmp_path_factory):
    records = launch(2, "hardening", tmp_path_factory.mktemp("dist_hardening"), timeout=90)
    assert_all_ok(records)  # before the fix, rank 0 died with SIGABRT inside Gloo
    return [r["json"]["hardening"] for r in records]


DIFFERING = {
    "shape": r"params\[0\] \(0.weight\) is Float \[9, 4\] on rank 1 and Float \[8, 4\] on rank 0",
    "count": r"the number of parameters is 4 on rank 1 and 2 on rank 0",
    "dtype": r"params\[0\] \(0.weight\) is Double \[8, 4\] on rank 1 and Float \[8, 4\] on",
    "requires_grad": r"params\[0\] \(0.weight\) is Float \[8, 4\] \(requires_grad=False\) on rank 1",
    "buffers": r"buffers\[0\] \(1.running_mean\) is Float \[9\] on rank 1 and Float \[8\] on rank 0",
    "accumulation_steps": r"accumulation_steps is 3 on rank 1 and 2 on rank 0",
    "compression": r"compression is 'bf16' on rank 1 and None on rank 0",
    "bucket_cap_mb": r"bucket_cap_mb is 26 on rank 1 and 25 on rank 0",
}


@pytest.mark.parametrize("case", sorted(DIFFERING))
def test_models_or_options_that_differ_between_ranks_raise_on_every_rank(hardening2, case):
    """Issue 23 items 1 and 4: one small all-reduce at construction compares the models and the
    options; every rank raises the same ValueError naming the first difference (the group stays
    usable: the scenario trains afterwards)."""
    for facts in hardening2:
        err = facts[case]
        assert err is not None, f"{case}: construction succeeded"
        assert err["type"] == "ValueError", err
        assert "every rank must wrap the same model with the same options" in err["message"]
        assert re.search(DIFFERING[case], err["message"]), err["message"]


def test_clip_grad_norm_zero_zeroes_the_reduced_grads_on_every_rank(hardening2):
    for facts in hardening2:
        c = facts["clip0"]
        assert c["all_zero"]
        assert c["norm"] == pytest.approx(c["reference_norm"], rel=1e-6)
        assert c["norm"] == pytest.approx(c["torch_returned"], rel=1e-6)


# ---- uneven inputs, a dead rank --------------------------------------------------------------------


def test_uneven_inputs_raise_naming_the_rank_that_ran_out(tmp_path):
    records = launch(2, "join_throw", tmp_path)
    assert_all_ok(records)
    r0, r1 = (r["json"]["join"] for r in records)
    assert r1["done"] == 2 and r1["error"] is None  # rank 1 ran out after 2 steps, left cleanly
    assert r0["done"] == 2 and r0["error"] is not None
    assert r0["error"]["ranks"] == [1] and r0["error"]["is_runtime_error"]
    assert re.search(r"rank 1 ran out of data before optimizer step 3", r0["error"]["message"])


def test_uneven_inputs_end_quietly_by_default(tmp_path):
    records = launch(2, "join_quiet", tmp_path)
    assert_all_ok(records)
    r0, r1 = (r["json"]["join"] for r in records)
    assert r0["done"] == r1["done"] == 2
    assert any("rank 1 ran out of data" in w for w in r0["warnings"])


def test_even_inputs_inside_join_cost_one_small_collective_per_step(tmp_path):
    records = launch(2, "join_even", tmp_path)
    assert_all_ok(records)
    for r in records:
        j = r["json"]["join"]
        assert j["done"] == 4 and j["error"] is None
        assert j["sync_collectives"] == [j["buckets"] + 1] * 4


def test_a_killed_rank_ends_the_others_with_an_error_within_the_timeout(tmp_path):
    timeout = 20
    records = launch(2, "kill", tmp_path, timeout=120, env={"TS_PG_TIMEOUT": str(timeout)})
    r0, r1 = records
    assert r1["returncode"] == -9, r1["log"][-2000:]
    assert r0["returncode"] == 3, f"rank 0 did not fail cleanly:\n{r0['log'][-3000:]}"
    facts = r0["json"]
    assert facts["elapsed_after_kill"] < timeout + 5, facts
    assert "Error" in facts["error"], facts


# ---- the example under torchrun ---------------------------------------------------------------------


def test_torchrun_runs_the_python_example(tmp_path):
    example = HERE.parents[2] / "examples" / "python" / "ddp_accumulate.py"
    if not example.exists():
        pytest.skip("examples/python/ddp_accumulate.py is not in this checkout")
    torchrun = shutil.which("torchrun")
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        str(example),
        "--steps",
        "3",
        "--accumulation-steps",
        "2",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "optimizer step 3" in p.stdout, p.stdout
