"""One rank of a torchspeed.dist test (launched by dist_helpers.launch with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT): trains with AccumulatingDDP on Gloo and writes what the test checks to
<out>/rank<r>.pt (tensors) and <out>/rank<r>.json (facts).

    python dist_worker.py <scenario> <out_dir>
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import gc
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from dist_helpers import (
    CASES,
    EMPTY_CASES,
    EMPTY_RESUME,
    LOWBIT_CASES,
    MAIN4,
    MODELS,
    ZERO4,
    ZERO_CASES,
    Net,
    inject_inf,
    lowbit_loop,
    make_optimizer,
    optimizer_spec,
    side_used,
    token_data,
    window_data,
)
from torch import nn

import torchspeed
from torchspeed.dist import AccumulatingDDP, RanksOutOfData

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
CAPS = dict(bucket_cap_mb=0.004, first_bucket_cap_mb=0.001)  # several buckets for a 1.5K-param net


def seq(pg) -> int:
    """Collectives issued on the group so far (Gloo's own counter, independent of our stats)."""
    return pg._get_sequence_number_for_group()


def wrapped_net(dtype, model="net", **kw):
    net = MODELS[model](dtype)
    with torch.no_grad():  # ranks start different: construction must broadcast rank 0's params
        for p in net.parameters():
            p.add_(0.25 * RANK)
    return AccumulatingDDP(net, **{**CAPS, **kw})


def train(
    case,
    dtype,
    opt_name,
    k,
    steps,
    mb=4,
    style="counter",
    compression=None,
    find_unused=False,
    clip=None,
    scaler=False,
    freeze_at=None,
):
    pg = dist.distributed_c10d._get_default_group()
    model = wrapped_net(
        dtype,
        accumulation_steps=1 if style == "no_sync" else k,
        compression=compression,
        find_unused_parameters=find_unused,
    )
    opt = make_optimizer(opt_name, model.parameters())
    sc = torch.amp.GradScaler("cpu", init_scale=2.0**10) if scaler else None
    micro = []
    for step in range(steps):
        if step == freeze_at:  # frozen after wrapping, on every rank
            model.module.l1.weight.requires_grad_(False)
        x, y = window_data(step, WORLD, k, mb, dtype)
        for j in range(k):
            s0 = seq(pg)
            last = j == k - 1
            ctx = model.no_sync() if style == "no_sync" and not last else contextlib.nullcontext()
            with ctx:
                scope = model.micro_batch() if style == "micro_batch" else contextlib.nullcontext()
                with scope:
                    out = model(x[RANK, j], use_side=side_used(case, step, RANK, j, k))
                    loss = nn.functional.mse_loss(out, y[RANK, j]) / k
                    (sc.scale(loss) if sc else loss).backward()
            st = model.stats()
            micro.append(
                {
                    "step": step,
                    "micro": j,
                    "sync_now": model.sync_now,
                    "collectives": seq(pg) - s0,
                    "bucket_collectives": st["last_bucket_collectives"],
                    "bytes": st["last_bytes_reduced"],
                    "overlap": st["last_overlap"],
                }
            )
        assert model.sync_now, "the window's last micro-step must report sync_now"
        grad_is_none = {n: p.grad is None for n, p in model.module.named_parameters()}
        if sc:
            sc.unscale_(opt)
        if clip:
            model.clip_grad_norm_(clip)
        if sc:
            sc.step(opt)
            sc.update()
        else:
            opt.step()
        opt.zero_grad()
    st = model.stats()
    return model, {
        "params": {n: p.detach().clone() for n, p in model.module.named_parameters()},
        "grad_is_none": grad_is_none,  # at the last optimizer step
        "micro": micro,
        "stats": st,
        "grads_none_after_unused_window": None,
    }


def token_case(k, steps, mb=4):
    pg = dist.distributed_c10d._get_default_group()
    model = wrapped_net(torch.float64, accumulation_steps=k)
    opt = make_optimizer("sgd", model.parameters())
    controls = []
    for step in range(steps):
        x, y, valid = token_data(step, WORLD, k, mb)
        s0 = seq(pg)
        factor = model.global_mean_factor(int(valid[RANK].sum()))
        controls.append(seq(pg) - s0)
        for j in range(k):
            v = int(valid[RANK, j])
            per_sample = ((model(x[RANK, j, :v], use_side=True) - y[RANK, j, :v]) ** 2).mean(dim=1)
            (per_sample.sum() * factor).backward()
        opt.step()
        opt.zero_grad()
    return {
        "params": {n: p.detach().clone() for n, p in model.module.named_parameters()},
        "controls": controls,
    }


def unused_grads_case(k=2):
    """find_unused_parameters: after a window where no rank used `side`, its grad is None."""
    model = wrapped_net(torch.float64, accumulation_steps=k, find_unused_parameters=True)
    x, y = window_data(0, WORLD, k, 4, torch.float64)
    for j in range(k):
        nn.functional.mse_loss(model(x[RANK, j]), y[RANK, j]).backward()
    none = {n: p.grad is None for n, p in model.module.named_parameters()}
    # And without find_unused_parameters: a defined zero gradient.
    plain = wrapped_net(torch.float64, accumulation_steps=k)
    for p in plain.parameters():
        p.grad = None
    for j in range(k):
        nn.functional.mse_loss(plain(x[RANK, j]), y[RANK, j]).backward()
    zero = plain.module.side.weight.grad
    return {"none": none, "plain_side_grad_is_zero": bool(zero is not None and (zero == 0).all())}


def state_dict_case():
    model = wrapped_net(torch.float64, accumulation_steps=2)
    sd = model.state_dict()
    bare = Net(torch.float64)
    bare.load_state_dict(sd)  # plain keys load into the bare model
    torch_style = {"module." + key: v.clone() + 1 for key, v in sd.items()}
    model.load_state_dict(torch_style)  # and torch DDP's prefixed keys load into the wrapper
    ok_prefixed = all(
        torch.equal(p, torch_style["module." + n]) for n, p in model.module.named_parameters()
    )
    model.load_state_dict(sd)
    ok_plain = all(torch.equal(p, sd[n]) for n, p in model.module.named_parameters())
    return {
        "keys": sorted(sd.keys()),
        "ok_prefixed": ok_prefixed,
        "ok_plain": ok_plain,
        "repr": repr(model).splitlines()[0],
    }


def join_case(mode, steps=4, k=2, zero=0):
    pg = dist.distributed_c10d._get_default_group()
    model = wrapped_net(torch.float64, accumulation_steps=k, zero=zero)
    if zero:  # ZeRO-1: the sharded AdamW (state on each rank for its shard only)
        cls, kw = optimizer_spec("adamw")
        opt = model.zero_optimizer(cls, **kw)
    else:
        opt = make_optimizer("sgd", model.parameters())
    my_steps = steps if (mode == "even" or RANK == 0) else steps - 2
    done, err, sync_collectives = 0, None, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with model.join(throw_on_early_termination=(mode == "throw")):
                for step in range(my_steps):
                    x, y = window_data(step, WORLD, k, 4, torch.float64)
                    for j in range(k):
                        s0 = seq(pg)
                        nn.functional.mse_loss(model(x[RANK, j]), y[RANK, j]).backward()
                        if j == k - 1:
                            sync_collectives.append(seq(pg) - s0)
                    opt.step()
                    opt.zero_grad()
                    done += 1
        except RanksOutOfData as e:
            err = {
                "message": str(e),
                "ranks": list(e.ranks),
                "is_runtime_error": isinstance(e, RuntimeError),
            }
    return {
        "done": done,
        "error": err,
        "warnings": [str(w.message) for w in caught],
        "sync_collectives": sync_collectives,
        "buckets": model.stats()["buckets"],
        "params": {n: p.detach().clone() for n, p in model.module.named_parameters()},
    }


PHASE = {"where": None}  # where the survivor of kill_case was when its error came


def _die():
    Path(OUT / "killed_at").write_text(str(time.time()))
    os.kill(os.getpid(), 9)


def kill_case(steps=6, k=2, zero=0, at="backward"):
    """Rank 1 dies at step 2: before its synchronising backward (the others wait in the gradient
    collectives) or, with zero=1 and at="step", right before the ZeroOptimizer step (the others
    wait in the parameter all-gather)."""
    model = wrapped_net(torch.float64, accumulation_steps=k, zero=zero)
    if zero:
        cls, kw = optimizer_spec("adamw")
        opt = model.zero_optimizer(cls, **kw)
    else:
        opt = make_optimizer("sgd", model.parameters())
    for step in range(steps):
        x, y = window_data(step, WORLD, k, 4, torch.float64)
        for j in range(k):
            if RANK == 1 and step == 2 and j == 0 and at == "backward":
                _die()
            PHASE["where"] = f"step {step} backward"
            nn.functional.mse_loss(model(x[RANK, j]), y[RANK, j]).backward()
        if RANK == 1 and step == 2 and at == "step":
            _die()
        PHASE["where"] = f"step {step} optimizer"
        opt.step()
        opt.zero_grad()


def _differing_models():
    """(case, make the module, extra wrapper options) per case: rank 1 differs from rank 0 in one
    thing each, and construction must raise the same ValueError on every rank (never abort)."""
    r = RANK

    def seq_net(*layers):
        torch.manual_seed(0)
        return nn.Sequential(*layers)

    return {
        "shape": (lambda: seq_net(nn.Linear(4, 8 if r == 0 else 9)), {}),
        "count": (
            lambda: seq_net(nn.Linear(4, 8), *([nn.Linear(8, 8)] if r == 1 else [])),
            {},
        ),
        "dtype": (lambda: seq_net(nn.Linear(4, 8)).to(torch.float64 if r else torch.float32), {}),
        "requires_grad": (
            lambda: seq_net(nn.Linear(4, 8)).requires_grad_(r == 0),
            {},
        ),
        "buffers": (lambda: seq_net(nn.Linear(4, 8), nn.BatchNorm1d(8 + r, affine=False)), {}),
        "accumulation_steps": (lambda: seq_net(nn.Linear(4, 8)), dict(accumulation_steps=2 + r)),
        "compression": (
            lambda: seq_net(nn.Linear(4, 8)),
            dict(compression="bf16" if r else None),
        ),
        "bucket_cap_mb": (lambda: seq_net(nn.Linear(4, 8)), dict(bucket_cap_mb=25.0 + r)),
    }


def hardening_case():
    """Issue 23's DDP inputs on 2 ranks: models or options that differ between ranks (an error
    on every rank, the group still usable after it), a param frozen after wrapping (its .grad
    stays None), clip_grad_norm_(0) (zeroes the grads, as torch does)."""
    facts = {}
    for case, (make, kw) in _differing_models().items():
        try:
            AccumulatingDDP(make(), **kw)
            facts[case] = None
        except Exception as e:
            facts[case] = {"type": type(e).__name__, "message": str(e)}
    # The group survived: a working wrapper trains a window afterwards.
    model = wrapped_net(torch.float64, accumulation_steps=2)
    x, y = window_data(0, WORLD, 2, 4, torch.float64)
    for j in range(2):
        nn.functional.mse_loss(model(x[RANK, j]), y[RANK, j]).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    norm = model.clip_grad_norm_(0)
    copies = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for c, g in zip(copies, grads):
        c.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(copies, 0)
    facts["clip0"] = {
        "norm": float(norm),
        "reference_norm": float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))),
        "torch_returned": float(want),
        "all_zero": all(bool((p.grad == 0).all()) for p in model.parameters()),
    }
    return facts


# ---- ZeRO-1 ----------------------------------------------------------------------------------------


def zero_train(
    case,
    dtype,
    opt_name,
    k,
    steps,
    mb=4,
    clip=None,
    scaler=False,
    inf_at=None,
    compression=None,
    find_unused=False,
    save_at=None,
    resume=None,
    model="net",
    caps=None,
):
    """AccumulatingDDP(zero=1) with a ZeroOptimizer over `opt_name`, the loop of train(); resume
    from {"step", "model", "optimizers": every old rank's state dict (any world size), or this
    rank's own}."""
    pg = dist.distributed_c10d._get_default_group()
    model = wrapped_net(
        dtype,
        model=model,
        **(caps or {}),
        accumulation_steps=k,
        zero=1,
        compression=compression,
        find_unused_parameters=find_unused,
    )
    cls, kw = optimizer_spec(opt_name)
    opt = model.zero_optimizer(cls, **kw)
    sc = torch.amp.GradScaler("cpu", init_scale=2.0**10) if scaler else None
    first = 0
    if resume is not None:
        model.module.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizers"])
        if sc and resume.get("scaler"):
            sc.load_state_dict(resume["scaler"])
        first = resume["step"]
    micro, saved = [], None
    for step in range(first, steps):
        x, y = window_data(step, WORLD, k, mb, dtype)
        inject_inf(x, step, inf_at)
        for j in range(k):
            s0 = seq(pg)
            out = model(x[RANK, j], use_side=side_used(case, step, RANK, j, k))
            loss = nn.functional.mse_loss(out, y[RANK, j]) / k
            (sc.scale(loss) if sc else loss).backward()
            micro.append({"sync_now": model.sync_now, "collectives": seq(pg) - s0})
        if sc:
            sc.unscale_(opt)
        if clip:
            model.clip_grad_norm_(clip)
        if sc:
            sc.step(opt)
            sc.update()
        else:
            opt.step()
        opt.zero_grad()
        if save_at == step + 1:
            saved = {
                "step": step + 1,
                "model": {n: t.clone() for n, t in model.module.state_dict().items()},
                "optimizer": copy.deepcopy(opt.state_dict()),  # as torch.save would freeze it
                "scaler": sc.state_dict() if sc else None,
            }
    return {
        "params": {n: p.detach().clone() for n, p in model.module.named_parameters()},
        "micro": micro,
        "stats": model.stats(),
        "scale": float(sc.get_scale()) if sc else None,
        # Elements of each bucket this rank owns (0: an empty shard, padding only).
        "owned": [sum(n for *_, n in opt._core.layout(b)) for b in range(opt._core.num_buckets)],
        "saved": saved,
        "final_state": copy.deepcopy(opt.state_dict()),  # every rank's: the test consolidates
    }


def zero_scenario(names, resume_path=None):
    results = {name: zero_train(**ZERO_CASES[name]) for name in names}
    resume_case = dict(case="plain", dtype=torch.float64, opt_name="adamw", k=2, steps=4)
    results["z_resume"] = zero_train(**resume_case, save_at=2 if resume_path is None else 3)
    if resume_path is not None:  # another world size's checkpoint, re-sharded here
        results["z_resumed"] = zero_train(**resume_case, resume=torch.load(resume_path))
    return results


def zero_empty_scenario(resume_path):
    """Tiny on 4 ranks: rank 3 (or ranks 1-3, per bucket) owns no element of a shard."""
    results = {name: zero_train(**EMPTY_CASES[name]) for name in EMPTY_CASES}
    results["e_resume"] = zero_train(**EMPTY_RESUME, save_at=2)
    saved = results["e_resume"]["saved"]
    own = dict(saved, optimizers=saved["optimizer"])
    results["e_resumed_own"] = zero_train(**EMPTY_RESUME, resume=own)  # 4 -> 4, this rank's dict
    results["e_resumed_1"] = zero_train(**EMPTY_RESUME, resume=torch.load(resume_path))  # 1 -> 4
    return results


def zero_lowbit_scenario(resume_path=None):
    """ZeRO-1 over torchspeed's low-bit optimizer states: each case trained (checkpoint at
    LOWBIT_SAVE_AT), resumed from this rank's own checkpoint, and, with resume_path, resumed from
    every rank's checkpoints of another world size ({case: {"step", "model", "optimizers"}})."""
    other = torch.load(resume_path) if resume_path else {}
    results = {}
    for name, kw in LOWBIT_CASES.items():

        def run(resume=None, kw=kw):
            kk = kw["data_world"] * kw["k"] // WORLD
            model = wrapped_net(kw["dtype"], accumulation_steps=kk, zero=1)
            cls, hyper = optimizer_spec(kw["opt_name"])
            return lowbit_loop(model, model.zero_optimizer(cls, **hyper), kw, WORLD, RANK, resume)

        results[name] = run()
        saved = results[name]["saved"]
        results[name + "/own"] = run(dict(saved, optimizers=saved["optimizer"]))
        if name in other:
            results[name + "/resumed"] = run(other[name])
    return results


def main(scenario: str):
    timeout = datetime.timedelta(seconds=float(os.environ.get("TS_PG_TIMEOUT", "60")))
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD, timeout=timeout)
    results, facts = {}, {"torchspeed": torchspeed.__version__}
    if scenario in ("main", "main4"):
        names = MAIN4 if scenario == "main4" else tuple(CASES)
        cases = {name: CASES[name] for name in names}
        for name, kw in cases.items():
            _, results[name] = train(**kw)
        if scenario == "main":
            results["tokens"] = token_case(k=3, steps=3)
            facts["unused_grads"] = unused_grads_case()
            facts["state_dict"] = state_dict_case()
    elif scenario == "zero":
        results.update(zero_scenario(tuple(ZERO_CASES)))
    elif scenario == "zero4":
        results.update(zero_scenario(ZERO4, os.environ["TS_ZERO_RESUME"]))
    elif scenario == "zempty":
        results.update(zero_empty_scenario(os.environ["TS_ZERO_RESUME"]))
    elif scenario == "zlowbit":
        results.update(zero_lowbit_scenario(os.environ.get("TS_ZERO_RESUME")))
    elif scenario == "hardening":
        facts["hardening"] = hardening_case()
    elif scenario.startswith("join_"):
        facts["join"] = join_case(scenario.split("_", 1)[1])
        facts["join"].pop("params")
    elif scenario.startswith("zjoin_"):  # uneven inputs under ZeRO-1
        facts["join"] = join_case(scenario.split("_", 1)[1], zero=1)
        results["join_params"] = facts["join"].pop("params")
    elif scenario == "kill" or scenario.startswith("zkill_"):
        t0 = time.time()
        try:
            if scenario == "kill":
                kill_case()
            else:  # zkill_backward, zkill_step: under ZeRO-1
                kill_case(zero=1, at=scenario.split("_", 1)[1])
        except Exception as e:  # the expected failure: write it down, then fail the process
            facts["error"] = f"{type(e).__name__}: {e}"
            facts["phase"] = PHASE["where"]
            facts["elapsed_after_kill"] = time.time() - float((OUT / "killed_at").read_text())
            facts["elapsed"] = time.time() - t0
            (OUT / f"rank{RANK}.json").write_text(json.dumps(facts))
            sys.stdout.flush()
            os._exit(3)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    torch.save(results, OUT / f"rank{RANK}.pt")
    (OUT / f"rank{RANK}.json").write_text(json.dumps(facts, default=str))
    del results
    gc.collect()  # every wrapper (and its reference to the group) is gone before the group
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown racing the other rank's exit (the results are written)


if __name__ == "__main__":
    OUT = Path(sys.argv[2])
    main(sys.argv[1])
