"""Helpers of the torchspeed.dist tests: whether the area is built, a bounded multi-process launcher
(Gloo on 127.0.0.1, every process in its own session, killed with its group on timeout or failure:
no orphans), the one table of training cases, and the model, data and single-process references
that dist_worker.py and the test files share."""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
WORKER = HERE / "dist_worker.py"

F64 = dict(rtol=1e-12, atol=1e-14)  # the float64 bound: 1e-12 relative
F32 = dict(rtol=1e-5, atol=1e-6)  # float32: 1e-5 relative (atol for values near zero)


def _dist_missing():
    """None when the dist area is built, else its one "area not built" error (the tests skip
    with it as the reason)."""
    from torchspeed._native import AreaNotBuiltError, native_module

    try:
        native_module("dist")
    except AreaNotBuiltError as e:
        return e
    return None


DIST_MISSING = _dist_missing()

# ---- scale_cast_ ----------------------------------------------------------------------------------

PAIRS = [
    (torch.float32, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.bfloat16),
    (torch.float64, torch.float64),
]


def scale_cast_reference(src, scale, out_dtype):
    """fp32 arithmetic (fp64 for fp64), one rounding into the output dtype, as torch rounds."""
    if src.dtype == torch.float64:
        return src * scale
    return (src.float() * torch.tensor(scale, dtype=torch.float32)).to(out_dtype)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    world: int, scenario: str, out_dir: Path, timeout: float = 180.0, env=None
) -> list[dict]:
    """Runs dist_worker.py `scenario` on `world` ranks; returns one record per rank: returncode,
    elapsed seconds, stdout+stderr, and the JSON/pt results the rank wrote (if any)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    t0 = time.monotonic()
    base = dict(os.environ)
    base.update(env or {})
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
    base.setdefault("OMP_NUM_THREADS", "1")
    base["PYTHONPATH"] = os.pathsep.join([str(HERE)] + sys.path)
    try:
        for rank in range(world):
            e = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            log = open(out_dir / f"rank{rank}.log", "w")
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, str(WORKER), scenario, str(out_dir)],
                        env=e,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    ),
                    log,
                )
            )
        records = []
        for rank, (p, _log) in enumerate(procs):
            left = max(1.0, timeout - (time.monotonic() - t0))
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                rc = None
            records.append({"rank": rank, "returncode": rc, "elapsed": time.monotonic() - t0})
        return _collect(records, out_dir)
    finally:
        for p, log in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            log.close()


def _collect(records, out_dir: Path):
    for r in records:
        r["log"] = (out_dir / f"rank{r['rank']}.log").read_text(errors="replace")
        res = out_dir / f"rank{r['rank']}.json"
        r["json"] = json.loads(res.read_text()) if res.exists() else None
        pt = out_dir / f"rank{r['rank']}.pt"
        r["pt"] = torch.load(pt, weights_only=False) if pt.exists() else None
    return records


def assert_all_ok(records):
    for r in records:
        assert r["returncode"] == 0, (
            f"rank {r['rank']} exited with {r['returncode']}:\n{r['log'][-4000:]}"
        )


# ---- the shared model, data and references --------------------------------------------------------


class Net(nn.Module):
    """A small MLP with a side branch that only some micro-steps use (pytorch#69031's case)."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(8, 32)
        self.l2 = nn.Linear(32, 32)
        self.l3 = nn.Linear(32, 4)
        self.side = nn.Linear(8, 4)
        self.to(dtype)

    def forward(self, x, use_side=False):
        h = torch.tanh(self.l1(x))
        h = torch.tanh(self.l2(h))
        out = self.l3(h)
        if use_side:
            out = out + self.side(x)
        return out


class Tiny(nn.Module):
    """9 trainable elements (tanh of one Linear(8, 1), repeated to Net's 4 outputs): on 4 ranks a
    bucket of 9 elements gives ranks 0-2 three each and rank 3 none (padding only); one bucket per
    param gives rank 0 the bias alone. An inf in input feature 0 makes only weight[0]'s gradient
    non-finite (tanh saturates), an element of rank 0's shard."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(8, 1)
        self.to(dtype)

    def forward(self, x, use_side=False):
        return torch.tanh(self.l1(x)).expand(-1, 4)


MODELS = {"net": Net, "tiny": Tiny}


# The training cases of the "main" scenario (dist_worker.train's arguments), one table for the
# worker and the tests; MAIN4 runs on 4 ranks too.
F64_, F32_ = torch.float64, torch.float32
CASES = {
    "f64_sgd": dict(case="plain", dtype=F64_, opt_name="sgd", k=3, steps=3),
    "f32_ts_adamw": dict(case="plain", dtype=F32_, opt_name="ts_adamw", k=2, steps=3),
    "f64_no_sync": dict(case="plain", dtype=F64_, opt_name="sgd", k=3, steps=3, style="no_sync"),
    "f64_micro_batch": dict(
        case="plain", dtype=F64_, opt_name="sgd", k=3, steps=3, style="micro_batch"
    ),
    "f32_bf16": dict(case="plain", dtype=F32_, opt_name="sgd", k=2, steps=3, compression="bf16"),
    "f32_fp16": dict(case="plain", dtype=F32_, opt_name="sgd", k=2, steps=3, compression="fp16"),
    "f32_none": dict(case="plain", dtype=F32_, opt_name="sgd", k=2, steps=3),
    "unused_sgd": dict(case="unused", dtype=F64_, opt_name="sgd", k=3, steps=3, find_unused=True),
    "unused_adamw": dict(
        case="unused", dtype=F64_, opt_name="adamw", k=3, steps=3, find_unused=True
    ),
    # One window: the side branch used on rank 0's first micro-step only.
    "unused_no_find": dict(case="unused", dtype=F64_, opt_name="sgd", k=3, steps=1),
    # l1.weight frozen after wrapping, before step 1: its .grad stays None.
    "frozen_adamw": dict(case="plain", dtype=F64_, opt_name="adamw", k=2, steps=3, freeze_at=1),
    "f32_scaler_clip": dict(
        case="plain", dtype=F32_, opt_name="sgd", k=2, steps=3, clip=0.05, scaler=True
    ),
}
MAIN4 = ("f64_sgd", "f32_ts_adamw")

# The ZeRO-1 cases (dist_worker.zero_train's arguments): the same math as CASES, the state sharded.
ZERO_CASES = {
    "z_f64_sgd": dict(case="plain", dtype=F64_, opt_name="sgd", k=3, steps=3),
    "z_f64_adamw_clip": dict(case="plain", dtype=F64_, opt_name="adamw", k=2, steps=3, clip=0.05),
    "z_f32_ts_adamw": dict(case="plain", dtype=F32_, opt_name="ts_adamw", k=2, steps=3),
    # LAMB's trust ratio over each whole param, its pieces on several ranks (the norms summed).
    "z_f32_ts_lamb": dict(case="plain", dtype=F32_, opt_name="ts_lamb", k=2, steps=3),
    "z_f64_scaler_inf": dict(
        case="plain", dtype=F64_, opt_name="adamw", k=2, steps=3, scaler=True, inf_at=1
    ),
    # `side` is used on rank 0 only (in one micro-step): rank 1 gives it no gradient.
    "z_f64_unused_one_rank": dict(case="unused_one_rank", dtype=F64_, opt_name="sgd", k=2, steps=3),
    "z_f32_bf16": dict(case="plain", dtype=F32_, opt_name="sgd", k=2, steps=3, compression="bf16"),
    # AdamW with find_unused_parameters: `side` gets a gradient from rank 0 only (step 0 and 2)
    # and from no rank in step 1 (.grad None: no update, no state change, its step count stays).
    "z_f64_unused_adamw": dict(
        case="unused", dtype=F64_, opt_name="adamw", k=3, steps=3, find_unused=True
    ),
    # `side` never gets a gradient on any rank: no AdamW state at all, as in torch.optim.
    "z_f64_never_adamw": dict(
        case="never_side", dtype=F64_, opt_name="adamw", k=2, steps=3, find_unused=True
    ),
}
ZERO4 = ("z_f64_sgd", "z_f64_adamw_clip", "z_f64_unused_adamw", "z_f32_ts_lamb")
# ZeRO-1 on 4 ranks with Tiny, where rank 3 owns no element of the one bucket ("one") or ranks 1-3
# none of the bias bucket ("split"); infs on the empty rank's data and on a non-empty rank's.
ONE_BUCKET = dict(bucket_cap_mb=25.0, first_bucket_cap_mb=25.0)
SPLIT_BUCKETS = dict(bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
_TINY = dict(case="plain", dtype=F64_, opt_name="adamw", k=2, model="tiny")
EMPTY_CASES = {
    "e_one_adamw": dict(_TINY, steps=3, caps=ONE_BUCKET),
    "e_split_sgd": dict(_TINY, opt_name="sgd", steps=3, caps=SPLIT_BUCKETS),
    "e_one_scaler_clip": dict(
        _TINY, steps=4, caps=ONE_BUCKET, scaler=True, clip=0.05, inf_at={1: 3, 2: 0}
    ),
    "e_split_scaler_clip": dict(
        _TINY, steps=4, caps=SPLIT_BUCKETS, scaler=True, clip=0.05, inf_at={1: 3, 2: 1}
    ),
}
EMPTY_RESUME = dict(_TINY, steps=4, caps=ONE_BUCKET, scaler=True, clip=0.05, inf_at={1: 3})
# ZeRO-1 over torchspeed's low-bit optimizer states (the "zlowbit" scenarios): float32 Net, the
# data of 2 ranks x 2 micro-steps at every world size (data_world), a checkpoint at step 2.
# int8 with blocks of 32 from 64 elements on: most pieces are int8, a few small ones stay fp32,
# and the pieces' blocks do not line up with the blocks of other world sizes' pieces.
LOWBIT_SAVE_AT = 2
_LOWBIT = dict(case="plain", dtype=F32_, k=2, steps=4, data_world=2)
LOWBIT_CASES = {
    "lb_adamw_bf16": dict(_LOWBIT, opt_name="ts_adamw_bf16"),
    "lb_adamw_int8": dict(_LOWBIT, opt_name="ts_adamw_int8"),
    "lb_lion_int8": dict(_LOWBIT, opt_name="ts_lion_int8"),
    "lb_sgd_int8": dict(_LOWBIT, opt_name="ts_sgd_int8"),
}
_REFERENCE_ARGS = ("clip", "scaler", "freeze_at", "inf_at", "model")  # what changes the math


def case_reference(name, world, cases=None, **more):
    """The single-process reference of training case `name` over `world` ranks' samples (the
    wire format options, compression and the loop style, do not change the math)."""
    kw = (cases or CASES)[name]
    extra = {k: kw[k] for k in _REFERENCE_ARGS if k in kw} | more
    return reference(
        kw["case"], world, kw["k"], kw["steps"], 4, kw["dtype"], kw["opt_name"], **extra
    )


def window_data(step, world, k, mb, dtype):
    """The global batch of one optimizer step: x [world, k, mb, 8], y [world, k, mb, 4]."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(world, k, mb, 8, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randn(world, k, mb, 4, generator=g, dtype=torch.float64).to(dtype)
    return x, y


def side_used(case, step, rank, micro, k):
    """Which micro-steps use the side branch: 'unused' uses it on rank 0's first micro-step only
    (never on the synchronising one), and on no rank in step 1 (unused everywhere in a window);
    'plain' always uses it."""
    if case == "unused_one_rank":
        return rank == 0 and micro == 0
    if case == "never_side":
        return False
    if case != "unused":
        return True  # "plain": every param gets a gradient in every micro-step
    return step != 1 and rank == 0 and micro == 0


LOWBIT_BF16 = dict(state_dtype="bf16")
LOWBIT_INT8 = dict(state_dtype="int8", state_block=32, min_lowbit_numel=64)


def optimizer_spec(name):
    """(optimizer class, hyperparameters) of the tests' optimizer `name`."""
    import torchspeed

    specs = {
        "sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
        "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
        "ts_adamw": (torchspeed.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
        "ts_sgd": (torchspeed.optim.SGD, dict(lr=0.1, momentum=0.9)),
        "ts_lamb": (torchspeed.optim.LAMB, dict(lr=1e-2, weight_decay=0.1)),
        "ts_lion": (torchspeed.optim.Lion, dict(lr=1e-3, weight_decay=0.1)),
        "ts_adamw_bf16": (torchspeed.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, **LOWBIT_BF16)),
        "ts_adamw_int8": (torchspeed.optim.AdamW, dict(lr=1e-2, weight_decay=0.1, **LOWBIT_INT8)),
        "ts_lion_int8": (torchspeed.optim.Lion, dict(lr=1e-3, weight_decay=0.1, **LOWBIT_INT8)),
        "ts_sgd_int8": (torchspeed.optim.SGD, dict(lr=0.1, momentum=0.9, **LOWBIT_INT8)),
    }
    return specs[name]


def make_optimizer(name, params):
    cls, kw = optimizer_spec(name)
    return cls(params, **kw)


def inject_inf(x, step, inf_at):
    """An inf in rank 1's first sample of step `inf_at`, or with a dict {step: rank} in that
    rank's (GradScaler must skip that step)."""
    rank = inf_at.get(step) if isinstance(inf_at, dict) else (1 if step == inf_at else None)
    if rank is not None:
        x[rank, 0, 0, 0] = float("inf")


def reference(
    case,
    world,
    k,
    steps,
    mb,
    dtype,
    opt_name,
    clip=None,
    scaler=False,
    freeze_at=None,
    inf_at=None,
    start=None,
    with_state=False,
    model="net",
):
    """Single-process training over the same samples: each optimizer step accumulates the loss of
    every (rank, micro-step) chunk divided by world * k, which is the large-batch mean loss."""
    model = MODELS[model](dtype)
    opt = make_optimizer(opt_name, model.parameters())
    sc = torch.amp.GradScaler("cpu", init_scale=2.0**10) if scaler else None
    first = 0
    if start is not None:  # resume: (step, model state_dict, plain optimizer state_dict)
        first = start[0]
        model.load_state_dict(start[1])
        opt.load_state_dict(start[2])
    for step in range(first, steps):
        if step == freeze_at:
            model.l1.weight.requires_grad_(False)
        x, y = window_data(step, world, k, mb, dtype)
        inject_inf(x, step, inf_at)
        for r in range(world):
            for j in range(k):
                out = model(x[r, j], use_side=side_used(case, step, r, j, k))
                loss = nn.functional.mse_loss(out, y[r, j]) / (world * k)
                (sc.scale(loss) if sc else loss).backward()
        if sc:
            sc.unscale_(opt)
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if sc:
            sc.step(opt)
            sc.update()
        else:
            opt.step()
        opt.zero_grad()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    if with_state:  # the scale and the optimizer state as well
        return params, (sc.get_scale() if sc else None), opt.state_dict()
    return params


def large_batch_reference(world, k, steps, mb, dtype, opt_name):
    """Plain large-batch training: one forward over all world * k * mb samples per step."""
    model = Net(dtype)
    opt = make_optimizer(opt_name, model.parameters())
    for step in range(steps):
        x, y = window_data(step, world, k, mb, dtype)
        loss = nn.functional.mse_loss(model(x.reshape(-1, 8), use_side=True), y.reshape(-1, 4))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def token_data(step, world, k, mb):
    """Variable-length batches: per (rank, micro-step) a different number of valid samples."""
    x, y = window_data(step, world, k, mb, torch.float64)
    g = torch.Generator().manual_seed(5000 + step)
    valid = torch.randint(1, mb + 1, (world, k), generator=g)
    return x, y, valid


def token_reference(world, k, steps, mb):
    """The mean over every valid sample of the window on every rank, in one process."""
    model = Net(torch.float64)
    opt = make_optimizer("sgd", model.parameters())
    for step in range(steps):
        x, y, valid = token_data(step, world, k, mb)
        xs = torch.cat([x[r, j, : valid[r, j]] for r in range(world) for j in range(k)])
        ys = torch.cat([y[r, j, : valid[r, j]] for r in range(world) for j in range(k)])
        per_sample = ((model(xs, use_side=True) - ys) ** 2).mean(dim=1)
        per_sample.mean().backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def lowbit_loop(model, opt, kw, world, rank, resume=None):
    """The loop of a LOWBIT_CASES case on `world` ranks (this one `rank`): every world size trains
    on the data of kw["data_world"] ranks x kw["k"] micro-steps, rank r taking micro-batches
    [r * kk, (r + 1) * kk) of the step's global batch (kk = data_world * k / world), so runs at
    every world size see the same mean gradients. From resume = {"step", "model", "optimizers"}.
    Returns the params at the end, the pieces' gradients of every step (what each shard optimizer
    stepped with), the checkpoint at LOWBIT_SAVE_AT (with each shard optimizer's
    torch_state_dict()), the state_dict right after the load, and the layout."""
    k, data_world, dtype = kw["k"], kw["data_world"], kw["dtype"]
    kk = data_world * k // world
    first, loaded, saved, grads = 0, None, None, []
    if resume is not None:
        model.module.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizers"])
        loaded = copy.deepcopy(opt.state_dict())
        first = resume["step"]
    core = opt._core
    for step in range(first, kw["steps"]):
        x, y = window_data(step, data_world, k, 4, dtype)
        for j in range(kk):
            g = rank * kk + j
            out = model(x[g // k, g % k], use_side=True)
            (nn.functional.mse_loss(out, y[g // k, g % k]) / kk).backward()
        assert model.sync_now
        grads.append([[p.grad.clone() for p in core.pieces(b)] for b in range(core.num_buckets)])
        opt.step()
        opt.zero_grad()
        if step + 1 == LOWBIT_SAVE_AT:
            saved = {
                "step": step + 1,
                "model": {n: t.clone() for n, t in model.module.state_dict().items()},
                "optimizer": copy.deepcopy(opt.state_dict()),
                "torch_states": [copy.deepcopy(o.torch_state_dict()) for o in opt._inner],
            }
    return {
        "params": {n: p.detach().clone() for n, p in model.module.named_parameters()},
        "grads": grads,
        "saved": saved,
        "loaded": loaded,
        "final_state": copy.deepcopy(opt.state_dict()),
    }
