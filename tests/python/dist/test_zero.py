"""ZeRO-1 (torchspeed/dist/zero.py: ZeroOptimizer over AccumulatingDDP(zero=1)) on 2 and 4 Gloo
processes against single-process large-batch training with the same optimizer: reduce-scatter on
the synchronising micro-step only, each rank steps its shard, the params are all-gathered; global
clipping and GradScaler's inf-skip across the shards; per-rank state dicts re-sharded 2 -> 1,
2 -> 4 and 4 -> 1 (a plain torch.optim state_dict) continue the run that never stopped; ranks
whose shard of a bucket (or of every bucket) is padding only."""

from __future__ import annotations

import copy

import pytest
import torch
from dist_helpers import (
    DIST_MISSING,
    EMPTY_CASES,
    EMPTY_RESUME,
    F32,
    F64,
    LOWBIT_CASES,
    LOWBIT_SAVE_AT,
    MODELS,
    ZERO4,
    ZERO_CASES,
    Net,
    assert_all_ok,
    case_reference,
    inject_inf,
    launch,
    lowbit_loop,
    optimizer_spec,
    reference,
    window_data,
)
from torch import nn

from torchspeed.dist import AccumulatingDDP, ZeroOptimizer, consolidate_state_dict

pytestmark = pytest.mark.skipif(DIST_MISSING is not None, reason=str(DIST_MISSING))

RESUME = dict(case="plain", dtype=torch.float64, opt_name="adamw", k=2, steps=4)


@pytest.fixture(scope="module")
def zero2(tmp_path_factory):
    records = launch(2, "zero", tmp_path_factory.mktemp("dist_zero2"), timeout=120)
    assert_all_ok(records)
    return records


@pytest.fixture(scope="module")
def zero4(tmp_path_factory, zero2):
    out = tmp_path_factory.mktemp("dist_zero4")
    resume = out / "resume_from_2.pt"
    torch.save(_checkpoint(zero2, "z_resume"), resume)
    # The 4 ranks use Gloo's real reduce_scatter/all_gather; the 2 ranks its all-reduce (the
    # default on Gloo): both paths are checked against the same references.
    env = {"TS_ZERO_RESUME": str(resume), "TORCHSPEED_ZERO_COLLECTIVES": "native"}
    records = launch(4, "zero4", out, timeout=150, env=env)
    assert_all_ok(records)
    return records


def _checkpoint(records, case):
    saved = [r["pt"][case]["saved"] for r in records]
    return {
        "step": saved[0]["step"],
        "model": saved[0]["model"],
        "optimizers": [s["optimizer"] for s in saved],
    }


def _tol(dtype):
    return F64 if dtype == torch.float64 else F32


def _equal_on_every_rank(records, case, ref, tol):
    for r in records:
        got = r["pt"][case]["params"]
        for n, want in ref.items():
            where = f"rank {r['rank']} {case} {n}"
            torch.testing.assert_close(
                got[n], want, **tol, msg=lambda m, where=where: f"{where}: {m}"
            )


@pytest.mark.parametrize("case", sorted(set(ZERO_CASES) - {"z_f32_bf16"}))
def test_zero1_equals_single_process_large_batch_training(zero2, case):
    """Plain SGD, AdamW with global clipping, torchspeed's fused AdamW, GradScaler with an inf on
    rank 1 only (every rank skips that step and halves its scale), and a param that only rank 0
    gives a gradient."""
    kw = ZERO_CASES[case]
    ref, scale, _ = case_reference(case, 2, ZERO_CASES, with_state=True)
    _equal_on_every_rank(zero2, case, ref, _tol(kw["dtype"]))
    if kw.get("scaler"):
        for r in zero2:
            assert r["pt"][case]["scale"] == scale == 2.0**9  # the inf step halved it
            assert r["pt"][case]["stats"]["zero_skipped_steps"] == 1
            assert r["pt"][case]["stats"]["nonfinite_steps"] == 1


@pytest.mark.parametrize("case", ZERO4)
def test_zero1_on_four_ranks(zero4, case):
    kw = ZERO_CASES[case]
    _equal_on_every_rank(zero4, case, case_reference(case, 4, ZERO_CASES), _tol(kw["dtype"]))


def test_zero1_collectives_per_backend(zero2, zero4):
    for r in zero2:  # Gloo default: reduce by all-reduce, gather by one broadcast per rank
        assert r["pt"]["z_f64_sgd"]["stats"]["zero_collectives"] == "all_reduce"
        assert r["pt"]["z_f64_sgd"]["stats"]["zero_gather"] == "broadcast"
    for r in zero4:
        assert r["pt"]["z_f64_sgd"]["stats"]["zero_collectives"] == "reduce_scatter"
        assert r["pt"]["z_f64_sgd"]["stats"]["zero_gather"] == "all_gather"


def test_zero1_bf16_compression_stays_close(zero2):
    ref = case_reference("z_f32_bf16", 2, ZERO_CASES)
    _equal_on_every_rank(zero2, "z_f32_bf16", ref, dict(rtol=2e-2, atol=2e-3))
    for r in zero2:  # the reduce-scatter travelled in bf16: half the bytes of the fp32 buckets
        st = r["pt"]["z_f32_bf16"]["stats"]
        assert st["last_bytes_reduced"] * 2 == st["bucket_bytes"]


def test_zero1_communicates_only_on_the_sync_step_and_counts_its_bytes(zero2):
    """0 collectives while accumulating; on the synchronising micro-step one reduce-scatter per
    bucket plus the one small non-finite agreement; the step all-gathers every bucket."""
    for r in zero2:
        res = r["pt"]["z_f64_sgd"]
        st = res["stats"]
        for m in res["micro"]:
            assert m["collectives"] == (st["buckets"] + 1 if m["sync_now"] else 0), m
        assert st["last_bytes_reduced"] == st["bucket_bytes"]  # reduce-scatter input, float64
        assert st["last_bytes_all_gathered"] == st["bucket_bytes"]  # every padded bucket
        assert st["zero_steps"] == 3 and st["zero_skipped_steps"] == 0


@pytest.mark.parametrize("case", ["z_f64_adamw_clip", "z_f32_ts_adamw"])
def test_zero1_state_bytes_per_rank_are_one_world_th_plus_one_block(zero2, case):
    """torch.optim.AdamW on a float64 model and torchspeed's fused AdamW (float32 state): each
    rank's elementwise state (exp_avg, exp_avg_sq) covers at most its shard of every bucket (1/world
    of the elements plus less than one padding block per bucket), every element lies in exactly
    one rank's state, and the only other state is one step count per piece."""
    n = sum(p.numel() for p in Net().parameters())
    esize = 8 if ZERO_CASES[case]["dtype"] == torch.float64 else 4
    world = len(zero2)
    total = 0
    for r in zero2:
        res = r["pt"][case]
        st, sd = res["stats"], res["final_state"]
        elementwise = scalar = pieces = 0
        for bucket in sd["shards"]:
            for piece in bucket["state"].values():
                pieces += 1
                for v in piece.values():
                    if v.dim() == 1:
                        elementwise += v.numel() * v.element_size()
                    else:
                        scalar += v.numel() * v.element_size()
        assert elementwise <= 2 * esize * (n / world + st["buckets"]), (elementwise, st)
        assert scalar <= pieces * 8 and pieces <= len(list(Net().parameters())) + st["buckets"]
        assert st["optimizer_state_bytes"] == elementwise + scalar
        assert st["grad_shard_bytes"] * world == st["bucket_bytes"]
        total += elementwise
    assert total == 2 * esize * n  # every element's state on exactly one rank


@pytest.mark.parametrize("case", ["z_f64_unused_adamw", "z_f64_never_adamw"])
def test_zero1_adamw_state_of_params_without_gradient_is_torchs(zero2, case):
    """A param whose .grad is None in a step (no rank used it, find_unused_parameters) is neither
    updated nor advanced (exp_avg, exp_avg_sq and its step count stay), and one that never had a
    gradient has no state at all: the consolidated state equals single-process torch.optim.AdamW's
    state, entry by entry (float64, 1e-12)."""
    ref, _, want = case_reference(case, 2, ZERO_CASES, with_state=True)
    _equal_on_every_rank(zero2, case, ref, F64)
    got = consolidate_state_dict([r["pt"][case]["final_state"] for r in zero2])
    assert sorted(got["state"]) == sorted(want["state"])
    if case == "z_f64_never_adamw":  # side.weight and side.bias: slots 6 and 7, no state
        assert 6 not in got["state"] and 7 not in got["state"]
    for i, st in want["state"].items():
        assert sorted(got["state"][i]) == sorted(st), i
        for key, v in st.items():
            torch.testing.assert_close(got["state"][i][key], v, **F64, msg=f"state[{i}][{key}]")


# ---- uneven inputs, a dead rank --------------------------------------------------------------------


def _join_reference(steps, k=2, world=2):
    """join_case's loop in one process: AdamW, the loss of every (rank, micro-step) over the
    world (DDP's average), `side` unused (a zero gradient without find_unused_parameters)."""
    net = Net(torch.float64)
    cls, kw = optimizer_spec("adamw")
    opt = cls(net.parameters(), **kw)
    for step in range(steps):
        x, y = window_data(step, world, k, 4, torch.float64)
        for r in range(world):
            for j in range(k):
                (nn.functional.mse_loss(net(x[r, j]), y[r, j]) / world).backward()
        for p in net.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in net.named_parameters()}


@pytest.mark.parametrize("mode", ["throw", "quiet"])
def test_zero1_uneven_inputs_stop_every_rank_at_the_same_step(tmp_path, mode):
    """Rank 1 runs out after 2 of 4 optimizer steps inside join(): rank 0 stops before step 3
    (RanksOutOfData naming rank 1, or a warning), and both hold the params of the 2 sharded steps
    they took together (nothing half-stepped)."""
    records = launch(2, f"zjoin_{mode}", tmp_path, timeout=120)
    assert_all_ok(records)
    r0, r1 = (r["json"]["join"] for r in records)
    assert r0["done"] == r1["done"] == 2 and r1["error"] is None
    if mode == "throw":
        assert r0["error"]["ranks"] == [1] and r0["error"]["is_runtime_error"]
        assert "rank 1 ran out of data before optimizer step 3" in r0["error"]["message"]
    else:
        assert r0["error"] is None
        assert any("rank 1 ran out of data" in w for w in r0["warnings"])
    ref = _join_reference(steps=2)
    for r in records:
        for n, want in ref.items():
            torch.testing.assert_close(r["pt"]["join_params"][n], want, **F64, msg=n)


@pytest.mark.parametrize("at", ["backward", "optimizer"])
def test_zero1_killed_rank_ends_the_others_with_an_error_within_the_timeout(tmp_path, at):
    """Rank 1 is killed before its synchronising backward (rank 0 waits in the gradient
    reduce-scatter) or before the ZeroOptimizer step (rank 0 waits in the parameter all-gather):
    rank 0 raises from that very phase within the group's timeout, never hangs."""
    timeout = 20
    scenario = "zkill_backward" if at == "backward" else "zkill_step"
    records = launch(2, scenario, tmp_path, timeout=120, env={"TS_PG_TIMEOUT": str(timeout)})
    r0, r1 = records
    assert r1["returncode"] == -9, r1["log"][-2000:]
    assert r0["returncode"] == 3, f"rank 0 did not fail cleanly:\n{r0['log'][-3000:]}"
    facts = r0["json"]
    assert facts["elapsed_after_kill"] < timeout + 5, facts
    assert "Error" in facts["error"], facts
    assert facts["phase"] == f"step 2 {at}", facts


def _resume_in_one_process(single_group, ck, world, k, steps):
    """World size 1: ZeroOptimizer.load_state_dict re-shards every old rank's state here; the
    run goes on over the same global batches (world * k micro-steps per optimizer step)."""
    net = Net(torch.float64)
    model = AccumulatingDDP(
        net,
        accumulation_steps=world * k,
        zero=1,
        process_group=single_group,
        bucket_cap_mb=0.004,
        first_bucket_cap_mb=0.001,
    )
    opt = model.zero_optimizer(torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    net.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizers"])
    for step in range(ck["step"], steps):
        x, y = window_data(step, world, k, 4, torch.float64)
        for rank in range(world):
            for j in range(k):
                out = model(x[rank, j], use_side=True)
                (nn.functional.mse_loss(out, y[rank, j]) / (world * k)).backward()
        assert model.sync_now
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in net.named_parameters()}


@pytest.fixture
def single_group(tmp_path):
    import torch.distributed as dist

    return dist.ProcessGroupGloo(dist.FileStore(str(tmp_path / "store"), 1), 0, 1)


def test_resharding_2_to_1_continues_the_run_that_never_stopped(zero2, single_group):
    ck = _checkpoint(zero2, "z_resume")
    got = _resume_in_one_process(single_group, ck, 2, RESUME["k"], RESUME["steps"])
    for n, want in zero2[0]["pt"]["z_resume"]["params"].items():
        torch.testing.assert_close(got[n], want, **F64, msg=n)


def test_consolidated_state_dict_is_a_plain_torch_adamw_state_dict(zero2):
    """2 -> 1 without torchspeed at all: torch.optim.AdamW loads the consolidated state and the
    plain single-process loop continues to the params of the 2-rank run."""
    ck = _checkpoint(zero2, "z_resume")
    plain = consolidate_state_dict(ck["optimizers"])
    ref = reference(
        "plain",
        2,
        RESUME["k"],
        RESUME["steps"],
        4,
        torch.float64,
        "adamw",
        start=(ck["step"], ck["model"], plain),
    )
    for n, want in zero2[0]["pt"]["z_resume"]["params"].items():
        torch.testing.assert_close(ref[n], want, **F64, msg=n)


def test_resharding_2_to_4_and_4_to_1(zero2, zero4):
    """The 4-rank run resumed the 2-rank checkpoint at step 2 (z_resumed): it equals a plain
    single-process run from the consolidated 2-rank state over the 4 ranks' batches; and the
    4-rank checkpoint of step 3 consolidates into a plain state that continues to its end."""
    ck2 = _checkpoint(zero2, "z_resume")
    start2 = (ck2["step"], ck2["model"], consolidate_state_dict(ck2["optimizers"]))
    ref = reference(
        "plain", 4, RESUME["k"], RESUME["steps"], 4, torch.float64, "adamw", start=start2
    )
    _equal_on_every_rank(zero4, "z_resumed", ref, F64)
    ck4 = _checkpoint(zero4, "z_resume")
    assert ck4["step"] == 3 and len(ck4["optimizers"]) == 4
    start4 = (ck4["step"], ck4["model"], consolidate_state_dict(ck4["optimizers"]))
    ref = reference(
        "plain", 4, RESUME["k"], RESUME["steps"], 4, torch.float64, "adamw", start=start4
    )
    _equal_on_every_rank(zero4, "z_resume", ref, F64)


def test_zero_optimizer_refuses_bad_arguments(single_group):
    plain = AccumulatingDDP(Net(), process_group=single_group)
    with pytest.raises(ValueError, match="must be built with zero=1"):
        plain.zero_optimizer(torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="zero must be 0 or 1, got 3"):
        AccumulatingDDP(Net(), process_group=single_group, zero=3)
    with pytest.raises(TypeError, match="zero must be an int"):
        AccumulatingDDP(Net(), process_group=single_group, zero="1")
    model = AccumulatingDDP(Net(), process_group=single_group, zero=1)
    with pytest.raises(TypeError, match="optimizer_class must be a torch.optim.Optimizer"):
        model.zero_optimizer("adamw", lr=0.1)
    opt = model.zero_optimizer(torch.optim.SGD, lr=0.1)
    assert isinstance(opt, ZeroOptimizer) and isinstance(opt, torch.optim.Optimizer)
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="not a ZeroOptimizer state_dict"):
        opt.load_state_dict(torch.optim.SGD(Net().parameters(), lr=0.1).state_dict())
    with pytest.raises(ValueError, match=r"not a ZeroOptimizer state_dict \(format .*/v2\)"):
        opt.load_state_dict(dict(sd, format="torchspeed.dist.zero1/v1"))  # before the pieces
    with pytest.raises(TypeError, match="state_dict must be a dict or a list"):
        opt.load_state_dict("checkpoint.pt")
    half = dict(sd, world_size=2)  # one of two ranks' shards
    with pytest.raises(ValueError, match="needs every rank's state dict, got 1"):
        opt.load_state_dict(half)
    other = AccumulatingDDP(nn.Linear(3, 2).double(), process_group=single_group, zero=1)
    with pytest.raises(ValueError, match="another model or bucket layout"):
        other.zero_optimizer(torch.optim.SGD, lr=0.1).load_state_dict(sd)


def test_zero1_param_frozen_after_wrapping_keeps_its_value(single_group):
    """A param frozen after wrapping keeps its value under ZeroOptimizer too (its shard elements
    are stepped with a zero gradient, the result is not written back), so every param equals the
    single-process AdamW run frozen at the same step."""
    k, steps = 2, 3
    net = Net(torch.float64)
    model = AccumulatingDDP(net, accumulation_steps=k, zero=1, process_group=single_group)
    opt = model.zero_optimizer(torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    for step in range(steps):
        if step == 1:
            net.l1.weight.requires_grad_(False)
        x, y = window_data(step, 1, k, 4, torch.float64)
        for j in range(k):
            (nn.functional.mse_loss(model(x[0, j], use_side=True), y[0, j]) / k).backward()
        opt.step()
        opt.zero_grad()
    ref = reference("plain", 1, k, steps, 4, torch.float64, "adamw", freeze_at=1)
    for n, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), ref[n], **F64, msg=n)


def test_lr_schedulers_drive_the_shard_optimizers(single_group):
    """ZeroOptimizer is a torch.optim.Optimizer whose param_groups are the shard optimizers'
    groups: a torch LR scheduler changes the lr every shard steps with."""
    model = AccumulatingDDP(
        Net(), zero=1, process_group=single_group, bucket_cap_mb=0.004, first_bucket_cap_mb=0.001
    )
    opt = model.zero_optimizer(torch.optim.SGD, lr=0.1)
    assert len(opt.param_groups) == model.stats()["buckets"] >= 2
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x, y = window_data(0, 1, 1, 4, torch.float64)
    nn.functional.mse_loss(model(x[0, 0], use_side=True), y[0, 0]).backward()
    opt.step()
    sched.step()
    assert [inner.param_groups[0]["lr"] for inner in opt._inner] == [0.05] * len(opt._inner)


def test_zero1_step_reads_params_written_between_steps(single_group):
    """The step skips re-reading a param nothing wrote since its last gather (its version counter
    is unchanged), and re-reads one written in between (an in-place edit, a loaded checkpoint):
    the next step starts from the written value, as a plain optimizer would."""
    net, ref = Net(torch.float64), Net(torch.float64)
    model = AccumulatingDDP(net, zero=1, process_group=single_group)
    opt = model.zero_optimizer(torch.optim.SGD, lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        if step == 1:  # written between steps, in both runs
            with torch.no_grad():
                net.l1.weight.mul_(0.5)
                ref.l1.weight.mul_(0.5)
        if step == 2:
            net.load_state_dict({n: t * 1.25 for n, t in ref.state_dict().items()})
            ref.load_state_dict({n: t * 1.25 for n, t in ref.state_dict().items()})
        x, y = window_data(step, 1, 1, 4, torch.float64)
        nn.functional.mse_loss(model(x[0, 0], use_side=True), y[0, 0]).backward()
        nn.functional.mse_loss(ref(x[0, 0], use_side=True), y[0, 0]).backward()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    for (n, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), **F64, msg=n)


# ---- ranks with an empty shard -------------------------------------------------------------------


def _zero_in_one_process(group, kw, world, start=None, save_at=None):
    """Case `kw` (dist_worker.zero_train's arguments) at world size 1 over the same global batches
    (world * k micro-steps per optimizer step), from `start` = {"step", "model", "optimizers",
    "scaler"}: (params at the end, the checkpoint at step save_at or None)."""
    k, steps, dtype = kw["k"], kw["steps"], kw["dtype"]
    net = MODELS[kw.get("model", "net")](dtype)
    model = AccumulatingDDP(
        net, accumulation_steps=world * k, zero=1, process_group=group, **kw.get("caps", {})
    )
    cls, hyper = optimizer_spec(kw["opt_name"])
    opt = model.zero_optimizer(cls, **hyper)
    sc = torch.amp.GradScaler("cpu", init_scale=2.0**10) if kw.get("scaler") else None
    first, saved = 0, None
    if start is not None:
        net.load_state_dict(start["model"])
        opt.load_state_dict(start["optimizers"])
        if sc and start.get("scaler"):
            sc.load_state_dict(start["scaler"])
        first = start["step"]
    for step in range(first, steps):
        x, y = window_data(step, world, k, 4, dtype)
        inject_inf(x, step, kw.get("inf_at"))
        for rank in range(world):
            for j in range(k):
                loss = nn.functional.mse_loss(model(x[rank, j], use_side=True), y[rank, j])
                loss = loss / (world * k)
                (sc.scale(loss) if sc else loss).backward()
        assert model.sync_now
        if sc:
            sc.unscale_(opt)
        if kw.get("clip"):
            model.clip_grad_norm_(kw["clip"])
        if sc:
            sc.step(opt)
            sc.update()
        else:
            opt.step()
        opt.zero_grad()
        if save_at == step + 1:
            saved = {
                "step": step + 1,
                "model": {n: t.clone() for n, t in net.state_dict().items()},
                "optimizers": copy.deepcopy(opt.state_dict()),
                "scaler": sc.state_dict() if sc else None,
            }
    return {n: p.detach().clone() for n, p in net.named_parameters()}, saved


@pytest.fixture(scope="module")
def zempty(tmp_path_factory):
    """The 4-rank Tiny runs; the 1-process checkpoint of EMPTY_RESUME at step 2 is written first,
    and the 4 ranks resume it (1 -> 4, rank 3's shard empty)."""
    import torch.distributed as dist

    out = tmp_path_factory.mktemp("dist_zempty")
    group = dist.ProcessGroupGloo(dist.FileStore(str(out / "store"), 1), 0, 1)
    _, ck1 = _zero_in_one_process(group, EMPTY_RESUME, 4, save_at=2)
    torch.save(ck1, out / "resume_from_1.pt")
    records = launch(
        4, "zempty", out, timeout=150, env={"TS_ZERO_RESUME": str(out / "resume_from_1.pt")}
    )
    assert_all_ok(records)
    return records, ck1


def test_tiny_layouts_have_empty_shards(zempty):
    """What the cases below rely on: with one bucket, rank 3 owns none of the 9 elements; with one
    bucket per param, ranks 1-3 own none of the bias bucket."""
    records, _ = zempty
    assert [r["pt"]["e_one_adamw"]["owned"] for r in records] == [[3], [3], [3], [0]]
    assert [r["pt"]["e_split_sgd"]["owned"] for r in records] == [[1, 2], [0, 2], [0, 2], [0, 2]]


@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_zero1_with_empty_shards_equals_single_process_training(zempty, case):
    """AdamW/SGD with empty shards equal the single-process run (float64, 1e-12); with a
    GradScaler and clipping, an inf on the empty rank's data (step 1) and on a non-empty rank's
    (step 2) skips the step on every rank: the same scale everywhere, halved twice as in the
    single process."""
    records, _ = zempty
    kw = EMPTY_CASES[case]
    ref, scale, _ = case_reference(case, 4, EMPTY_CASES, with_state=True)
    _equal_on_every_rank(records, case, ref, F64)
    if kw.get("scaler"):
        for r in records:
            res = r["pt"][case]
            assert res["scale"] == scale == 2.0**8, (r["rank"], res["scale"], scale)
            assert res["stats"]["zero_skipped_steps"] == 2, r["rank"]
            assert res["stats"]["nonfinite_steps"] == 2, r["rank"]
            assert res["stats"]["zero_steps"] == 2, r["rank"]


def test_empty_shard_state_dicts_reload_on_4_ranks_and_from_1(zempty):
    """Rank 3's state dict (no state, one empty bucket) reloads on its own rank and the run goes
    on bit-identically; a world-size-1 checkpoint re-sharded onto the 4 ranks continues as the
    plain single-process AdamW from its consolidated state."""
    records, ck1 = zempty
    for r in records:
        want, got = r["pt"]["e_resume"]["params"], r["pt"]["e_resumed_own"]["params"]
        for n in want:
            assert torch.equal(got[n], want[n]), (r["rank"], n)
    start = (ck1["step"], ck1["model"], consolidate_state_dict([ck1["optimizers"]]))
    ref = case_reference("e", 4, {"e": EMPTY_RESUME}, start=start)
    _equal_on_every_rank(records, "e_resumed_1", ref, F64)


def test_empty_shard_state_dicts_reshard_4_to_1_and_consolidate(zempty, single_group):
    """The 4 ranks' checkpoint of step 2 (rank 3's shard empty) re-sharded onto one process, and
    consolidated into a plain torch AdamW state dict: both continue to the 4-rank run's end."""
    records, _ = zempty
    ck = _checkpoint(records, "e_resume")
    assert ck["optimizers"][3]["layout"][0]["pieces"] == []
    ck["scaler"] = records[0]["pt"]["e_resume"]["saved"]["scaler"]
    got, _ = _zero_in_one_process(single_group, EMPTY_RESUME, 4, start=ck)
    final = records[0]["pt"]["e_resume"]["params"]
    for n, want in final.items():
        torch.testing.assert_close(got[n], want, **F64, msg=n)
    start = (ck["step"], ck["model"], consolidate_state_dict(ck["optimizers"]))
    ref = case_reference("e", 4, {"e": EMPTY_RESUME}, start=start)
    for n, want in final.items():
        torch.testing.assert_close(ref[n], want, **F64, msg=n)


def _cpp_style(sd):
    """A state dict as the C++ ZeroOptimizer over torch::optim::AdamW writes it (the same v2
    layout): int step counts, only torch::optim's options, the C++ class name."""
    out = copy.deepcopy(sd)
    out["optimizer_class"] = "torch::optim::AdamW"
    for shard in out["shards"]:
        for st in shard["state"].values():
            st["step"] = int(st["step"])
        shard["param_groups"] = [
            {k: g[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "params")}
            for g in shard["param_groups"]
        ]
    return out


def test_state_dicts_in_the_cpp_layout_load_and_consolidate(zero2, single_group):
    """The C++ ZeroOptimizer writes the same v2 layout (tests/cpp/dist/test_zero.cpp loads
    Python-style dicts the other way): Python re-shards C++-style dicts 2 -> 1 and consolidates
    them into a plain torch.optim.AdamW state, and both continue to the 2-rank run's end."""
    ck = _checkpoint(zero2, "z_resume")
    ck["optimizers"] = [_cpp_style(sd) for sd in ck["optimizers"]]
    got = _resume_in_one_process(single_group, ck, 2, RESUME["k"], RESUME["steps"])
    want = zero2[0]["pt"]["z_resume"]["params"]
    for n in want:
        torch.testing.assert_close(got[n], want[n], **F64, msg=n)
    plain = consolidate_state_dict(ck["optimizers"])
    ref = reference(
        "plain",
        2,
        RESUME["k"],
        RESUME["steps"],
        4,
        torch.float64,
        "adamw",
        start=(ck["step"], ck["model"], plain),
    )
    for n in want:
        torch.testing.assert_close(ref[n], want[n], **F64, msg=n)


# ---- low-bit optimizer states (torchspeed.optim's state_dtype="bf16" / "int8") -------------------
# int8 moments are quantized in blocks of each piece (the blocks start at the piece's first
# element), so a sharded int8 run is not bitwise the unsharded one: its exact reference is the
# same optimizer stepped on the same per-param pieces. A re-sharded checkpoint is a conversion:
# each param's moments per element in float32 (int8 decoded, bf16 and float32 as they are), cut
# for the new pieces and quantized in their blocks by the optimizer's own load.

_CAPS = dict(bucket_cap_mb=0.004, first_bucket_cap_mb=0.001)  # dist_worker.CAPS
# The fp32 optimizer a consolidated low-bit state continues in (torch.optim where it exists).
_FP32_OF = {
    "ts_adamw_bf16": "adamw",
    "ts_adamw_int8": "adamw",
    "ts_lion_int8": "ts_lion",
    "ts_sgd_int8": "sgd",
}


def _lowbit_one_process(group, kw, resume=None):
    """Case `kw` of LOWBIT_CASES on one process (world size 1), from `resume`."""
    model = AccumulatingDDP(
        Net(kw["dtype"]),
        accumulation_steps=kw["data_world"] * kw["k"],
        zero=1,
        process_group=group,
        **_CAPS,
    )
    cls, hyper = optimizer_spec(kw["opt_name"])
    return lowbit_loop(model, model.zero_optimizer(cls, **hyper), kw, 1, 0, resume)


def _lowbit_checkpoints(results_per_rank):
    """{case: every rank's checkpoint at LOWBIT_SAVE_AT} from each rank's results."""
    return {
        name: {
            "step": results_per_rank[0][name]["saved"]["step"],
            "model": results_per_rank[0][name]["saved"]["model"],
            "optimizers": [r[name]["saved"]["optimizer"] for r in results_per_rank],
        }
        for name in LOWBIT_CASES
    }


@pytest.fixture(scope="module")
def lowbit(tmp_path_factory):
    """Every LOWBIT_CASES case on 1 process (in this one), 2 ranks (resuming the 1-process
    checkpoints: 1 -> 2) and 4 ranks (Gloo's native collectives, resuming the 2 ranks'
    checkpoints: 2 -> 4): {world: [each rank's results]}, and a 1-process group."""
    import torch.distributed as dist

    out = tmp_path_factory.mktemp("dist_zlowbit")
    group = dist.ProcessGroupGloo(dist.FileStore(str(out / "store"), 1), 0, 1)
    one = {name: _lowbit_one_process(group, kw) for name, kw in LOWBIT_CASES.items()}
    runs = {1: [one]}
    torch.save(_lowbit_checkpoints(runs[1]), out / "from1.pt")
    env = {"TS_ZERO_RESUME": str(out / "from1.pt")}
    records = launch(2, "zlowbit", out / "w2", timeout=120, env=env)
    assert_all_ok(records)
    runs[2] = [r["pt"] for r in records]
    torch.save(_lowbit_checkpoints(runs[2]), out / "from2.pt")
    env = {"TS_ZERO_RESUME": str(out / "from2.pt"), "TORCHSPEED_ZERO_COLLECTIVES": "native"}
    records = launch(4, "zlowbit", out / "w4", timeout=150, env=env)
    assert_all_ok(records)
    runs[4] = [r["pt"] for r in records]
    return runs, group


def _assert_state_equal(got, want, where):
    assert sorted(got) == sorted(want), where
    for key, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[key].dtype == v.dtype and torch.equal(got[key], v), f"{where}['{key}']"
        else:
            assert got[key] == v, f"{where}['{key}']"


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("case", sorted(LOWBIT_CASES))
def test_zero1_lowbit_steps_as_the_same_optimizer_on_the_same_pieces(lowbit, case, world):
    """Exact: the optimizer_class stepped in one process on tensors of the same per-param pieces
    (one optimizer per rank and bucket, the pieces in the same order) with the gradients the
    shards got reaches every rank's params and each piece's state bit for bit (bf16's stochastic
    rounding seeds from the piece's position, int8 blocks start at the piece's first element)."""
    runs, _ = lowbit
    kw = LOWBIT_CASES[case]
    cls, hyper = optimizer_spec(kw["opt_name"])
    flats = [p.detach().reshape(-1).clone() for p in Net(kw["dtype"]).parameters()]
    opts = []  # (rank, bucket, optimizer, [(slot, offset, numel)])
    for rank, res in enumerate(runs[world]):
        for b, entry in enumerate(res[case]["final_state"]["layout"]):
            if entry["pieces"]:
                ts = [flats[s][o : o + n].clone().requires_grad_() for s, o, n in entry["pieces"]]
                opts.append((rank, b, cls(ts, **hyper), entry["pieces"]))
    for step in range(kw["steps"]):
        for rank, b, opt, _ in opts:
            for t, g in zip(
                opt.param_groups[0]["params"], runs[world][rank][case]["grads"][step][b]
            ):
                t.grad = g
            opt.step()
    for rank, b, opt, pieces in opts:
        want = opt.state_dict()["state"]
        got = runs[world][rank][case]["final_state"]["shards"][b]["state"]
        assert sorted(got) == sorted(want), (rank, b)
        for k, st in want.items():
            _assert_state_equal(got[k], st, f"rank {rank} bucket {b} piece {k}")
        for t, (s, o, n) in zip(opt.param_groups[0]["params"], pieces):
            flats[s][o : o + n] = t.detach()
    for res in runs[world]:
        for (n, got), want in zip(res[case]["params"].items(), flats):
            assert torch.equal(got.reshape(-1), want), (case, world, n)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("case", sorted(LOWBIT_CASES))
def test_zero1_lowbit_own_state_dict_continues_bit_identically(lowbit, case, world):
    """Each rank reloads its own checkpoint of step 2 (codes and absmaxes, or bf16, as stored):
    the run goes on bit for bit as the one that never stopped."""
    runs, group = lowbit
    if world == 1:  # the fixture's ranks resumed their own in the workers; here the process
        res = runs[1][0][case]
        saved = res["saved"]
        own = [
            _lowbit_one_process(
                group, LOWBIT_CASES[case], dict(saved, optimizers=saved["optimizer"])
            )
        ]
    else:
        own = [r[case + "/own"] for r in runs[world]]
    for r, got in zip(runs[world], own):
        assert _lowbit_format_of(got["loaded"]) == _lowbit_format_of(r[case]["saved"]["optimizer"])
        for n, want in r[case]["params"].items():
            assert torch.equal(got["params"][n], want), (case, world, n)


def _lowbit_format_of(sd):
    """The dtypes of every piece's state entries (the stored formats), in order."""
    return [
        {k: v.dtype for k, v in st.items() if isinstance(v, torch.Tensor)}
        for shard in sd["shards"]
        for _, st in sorted(shard["state"].items())
    ]


@pytest.mark.parametrize("case", ["lb_adamw_bf16", "lb_adamw_int8"])
def test_zero1_lowbit_adamw_stays_close_to_unsharded_fp32_adamw(lowbit, case):
    """Against torchspeed's float32 AdamW, unsharded, over the same batches (4 steps, lr 1e-2):
    bf16 moments within 2e-4 of it, int8 moments (blocks of 32) within 2e-3, on 1, 2 and 4
    ranks; each step moves a param by about lr = 1e-2, so int8's bound is 5 % of one step per step
    (its moments are within 1/16 of theirs)."""
    runs, _ = lowbit
    kw = LOWBIT_CASES[case]
    ref = reference("plain", kw["data_world"], kw["k"], kw["steps"], 4, kw["dtype"], "ts_adamw")
    atol = 2e-4 if case.endswith("bf16") else 2e-3
    for world, ranks in runs.items():
        for r in ranks:
            for n, want in ref.items():
                torch.testing.assert_close(
                    r[case]["params"][n], want, rtol=0, atol=atol, msg=f"world {world} {n}"
                )


def _lowbit_full(dicts):
    """Per param slot, per key: the state of every element as the checkpoint `dicts` holds it,
    decoded here piece by piece with the pieces' own blocks (lowbit_decode): float32 for int8
    codes, as stored otherwise."""
    full = {}
    for d in dicts:
        for b, entry in enumerate(d["layout"]):
            shard = d["shards"][b]
            block = shard["param_groups"][0].get("state_block") if shard["param_groups"] else None
            for k, (slot, off, _) in enumerate(entry["pieces"]):
                st = shard["state"].get(k)
                if st is None:
                    continue
                for key, v in st.items():
                    if key.endswith("_absmax"):
                        continue
                    if not (isinstance(v, torch.Tensor) and v.dim() == 1):
                        full.setdefault(slot, {}).setdefault(key, {None: v})  # a step count
                        continue
                    if key + "_absmax" in st:
                        v = torch.ops.torchspeed.lowbit_decode(v, st[key + "_absmax"], block)
                    full.setdefault(slot, {}).setdefault(key, {})[off] = v
    return {
        slot: {
            key: parts[None] if None in parts else torch.cat([parts[o] for o in sorted(parts)])
            for key, parts in st.items()
        }
        for slot, st in full.items()
    }


def _assert_requantized(loaded_dicts, old_dicts, kw):
    """The state right after a re-sharding load, piece by piece, is the old state per element
    (_lowbit_full) cut for the piece and stored in the piece's format: int8 codes and absmaxes
    exactly lowbit_encode's of those float32 values in the piece's blocks, bf16 and float32 values
    equal; scalars (step counts) equal."""
    old = _lowbit_full(old_dicts)
    block = optimizer_spec(kw["opt_name"])[1].get("state_block")
    pieces = 0
    for d in loaded_dicts:
        for b, entry in enumerate(d["layout"]):
            for k, (slot, off, n) in enumerate(entry["pieces"]):
                st = d["shards"][b]["state"][k]
                for key, v in st.items():
                    where = f"rank {d['rank']} bucket {b} piece {k} '{key}'"
                    if key.endswith("_absmax"):
                        continue
                    if not (isinstance(v, torch.Tensor) and v.dim() == 1):
                        assert float(v) == float(old[slot][key]), where
                        continue
                    want = old[slot][key][off : off + n]
                    if key + "_absmax" in st:
                        signed = v.dtype == torch.int8
                        codes, absmax = torch.ops.torchspeed.lowbit_encode(want, signed, block)
                        assert torch.equal(v, codes), where
                        assert torch.equal(st[key + "_absmax"], absmax), where
                    else:
                        assert v.dtype == want.dtype and torch.equal(v, want), where
                    pieces += 1
    assert pieces > 0


def _assert_continues_close(got, want, kw, what):
    """A run resumed from a converted state against the one that never stopped, per step after
    the resume: params within 0.25 lr (AdamW's update is about lr per element; SGD's here is
    smaller), Lion's within 2 lr (its update is lr * sign: a moment near 0 that the conversion
    moves across 0 flips it), and the mean difference under 0.01 lr (measured: 0.002 lr and
    less; a wrong state changes most elements' updates)."""
    lr = optimizer_spec(kw["opt_name"])[1]["lr"]
    steps = kw["steps"] - LOWBIT_SAVE_AT
    atol = (2.0 if "lion" in kw["opt_name"] else 0.25) * lr * steps
    diff = torch.cat([(got[n] - w).abs().reshape(-1) for n, w in want.items()])
    assert diff.mean() <= 0.01 * lr * steps, (what, diff.mean().item() / lr)
    for n, w in want.items():
        torch.testing.assert_close(got[n], w, rtol=0, atol=atol, msg=f"{what} {n}")


@pytest.mark.parametrize("move", ["2->1", "1->2", "2->4"])
@pytest.mark.parametrize("case", sorted(LOWBIT_CASES))
def test_zero1_lowbit_resharding_requantizes_per_element_and_continues(lowbit, case, move):
    """A checkpoint of another world size loads as a conversion: the loaded state is the old one
    per element, re-quantized in the new pieces' blocks (exactly, _assert_requantized), and the
    run continues within _assert_continues_close of the run that never stopped."""
    runs, group = lowbit
    kw = LOWBIT_CASES[case]
    src, dst = (int(w) for w in move.split("->"))
    old = [r[case]["saved"]["optimizer"] for r in runs[src]]
    if dst == 1:
        ck = _lowbit_checkpoints(runs[src])[case]
        resumed = [_lowbit_one_process(group, kw, ck)]
    else:
        resumed = [r[case + "/resumed"] for r in runs[dst]]
    _assert_requantized([r["loaded"] for r in resumed], old, kw)
    for r in resumed:
        _assert_continues_close(r["params"], runs[src][0][case]["params"], kw, move)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", sorted(LOWBIT_CASES))
def test_zero1_lowbit_consolidates_to_float32_moments_that_continue(lowbit, case, world):
    """consolidate_state_dict decodes int8 moments to float32 (each piece with its own blocks:
    exactly what each shard optimizer's torch_state_dict() gives), keeps bf16 per element; the
    plain float32 optimizer (torch.optim.AdamW / SGD, torchspeed's fp32 Lion) loads it and
    continues within _assert_continues_close of the run that never stopped."""
    runs, _ = lowbit
    kw = LOWBIT_CASES[case]
    ck = _lowbit_checkpoints(runs[world])[case]
    plain = consolidate_state_dict(ck["optimizers"])
    shapes = ck["optimizers"][0]["param_shapes"]
    for r in runs[world]:  # the shard optimizers' own float32 export, piece by piece
        saved = r[case]["saved"]
        for b, entry in enumerate(saved["optimizer"]["layout"]):
            for k, (slot, off, n) in enumerate(entry["pieces"]):
                for key, v in saved["torch_states"][b]["state"][k].items():
                    got = plain["state"][slot][key]
                    if v.dim() == 0:
                        assert float(got) == float(v), (slot, key)
                        continue
                    assert got.shape == torch.Size(shapes[slot]), (slot, key)
                    got = got.reshape(-1)[off : off + n]
                    assert got.dtype in (torch.float32, torch.bfloat16), (slot, key, got.dtype)
                    assert torch.equal(got.float(), v), (slot, key)
    for st in plain["state"].values():
        assert not any(key.endswith("_absmax") for key in st)
    ref = reference(
        "plain",
        kw["data_world"],
        kw["k"],
        kw["steps"],
        4,
        kw["dtype"],
        _FP32_OF[kw["opt_name"]],
        start=(ck["step"], ck["model"], plain),
    )
    _assert_continues_close(ref, runs[world][0][case]["params"], kw, "consolidated")


def test_zero1_lowbit_bad_states_are_refused_and_load_nothing(lowbit):
    """Re-sharding refuses int8 codes whose absmaxes do not match the piece (naming the piece and
    the key); a state the last bucket's optimizer refuses as it loads (a NaN moment bound for
    int8) puts every bucket back: after either, the state_dict is what it was."""
    runs, group = lowbit
    kw = LOWBIT_CASES["lb_adamw_int8"]
    model = AccumulatingDDP(
        Net(kw["dtype"]), accumulation_steps=4, zero=1, process_group=group, **_CAPS
    )
    cls, hyper = optimizer_spec(kw["opt_name"])
    opt = model.zero_optimizer(cls, **hyper)
    ck = _lowbit_checkpoints(runs[2])["lb_adamw_int8"]
    opt.load_state_dict(ck["optimizers"])
    before = copy.deepcopy(opt.state_dict())

    def unchanged():
        now = opt.state_dict()
        for b, (x, y) in enumerate(zip(now["shards"], before["shards"])):
            assert sorted(x["state"]) == sorted(y["state"]), b
            for k in y["state"]:
                _assert_state_equal(x["state"][k], y["state"][k], f"bucket {b} piece {k}")

    def last_int8_piece(dicts):
        for d in reversed(dicts):
            for shard in reversed(d["shards"]):
                for st in shard["state"].values():
                    if "exp_avg_absmax" in st:
                        return st
        raise AssertionError("no int8 piece")

    short = copy.deepcopy(ck["optimizers"])
    st = last_int8_piece(short)
    st["exp_avg_absmax"] = st["exp_avg_absmax"][:-1].clone()
    with pytest.raises(ValueError, match=r"piece \d+'s 'exp_avg' must be \d+ int8 / uint8 codes"):
        opt.load_state_dict(short)
    unchanged()
    nan = copy.deepcopy(ck["optimizers"])
    st = last_int8_piece(nan)
    st["exp_avg_absmax"][0] = float("nan")
    with pytest.raises(ValueError, match="finite float32 absmaxes"):
        opt.load_state_dict(nan)
    unchanged()
    # The checkpoint with float32 moments and another step count, and a NaN in the last
    # bucket's exp_avg: re-sharded fine, refused by that bucket's int8 optimizer after the
    # buckets before it loaded theirs.
    fp32 = copy.deepcopy(ck["optimizers"])
    for d in fp32:
        for shard in d["shards"]:
            for st in shard["state"].values():
                st["step"] = st["step"] + 5
                for key in [k for k in st if k.endswith("_absmax")]:
                    code = key[: -len("_absmax")]
                    st[code] = torch.ops.torchspeed.lowbit_decode(
                        st[code], st.pop(key), hyper["state_block"]
                    )
    last = next(
        st for d in reversed(fp32) for sh in reversed(d["shards"]) for st in sh["state"].values()
    )
    last["exp_avg"][0] = float("nan")
    with pytest.raises(
        ValueError, match=r"refusal from bucket \d+: .*must be finite.*nothing was loaded"
    ):
        opt.load_state_dict(fp32)
    unchanged()
