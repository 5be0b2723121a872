"""torchspeed.optim.AdamW against torch.optim.AdamW (for-loop, foreach, fused=True) on the same
parameter sets, side by side in one process, with the measured triad bandwidth as the limit.

Bytes per param per step (read + write, counted once): fp32 Adam 28 B (p, g, m, v read; p, m, v
written); bf16 params + bf16 grads + fp32 master/m/v 28 B (g2 master4 m4 v4 read; master4 m4 v4
p2 written).
Sets: (a) one flat 1e8 fp32 param; (b) ResNet-50's 161 tensors (25.6M) and a GPT-2-small-shaped
transformer's 148 tensors (124M); (c) 10,000 tensors of 256-4096 elements; (d) bf16 + masters.
On CPU, DeepSpeed's CPU Adam joins the anchors when it is installed (`pip install deepspeed`).
`--sets` picks the sets (flat, resnet50, gpt2-small, small, bf16-params; default all).
Low-bit state (`--state-dtype`, default all three; CPU and CUDA): torchspeed AdamW with
state_dtype bf16 moves 20 B per fp32 param (p4 g4 m2 v2 read, p4 m2 v2 written) and int8 16 B
(+ 8 B of absmax per 256 elements), against torch fused AdamW's 28 B in the same run. Tensors
under 4096 elements keep fp32 moments under int8 (bytes counted as such). On CUDA, frac_of_bw is
the fraction of the measured device copy bandwidth.
`--optimizers` (default adamw; e.g. adamw,lion,sgd) also runs Lion and SGD, in their own groups
("<set> · lion", "<set> · sgd"), one row per state dtype: torchspeed Lion and SGD (momentum 0.9)
move 20 B per fp32 param with an fp32 moment (p4 g4 m4 read, p4 m4 written), 16 B with bf16 and
14 B with int8 (+ 8 B of absmax per 256 elements); SGD's anchor is torch.optim.SGD (foreach, and
fused on CUDA), Lion has none; their results go to bench_optim_<optimizers>_<device>.json.
"""

import argparse
import gc
import sys

import torch

import torchspeed
from torchspeed.benchmarks.harness import Harness


def resnet50_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inp = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            out = width * 4
            shapes += [
                (width, inp, 1, 1),
                (width,),
                (width,),
                (width, width, 3, 3),
                (width,),
                (width,),
                (out, width, 1, 1),
                (out,),
                (out,),
            ]
            if b == 0:
                shapes += [(out, inp, 1, 1), (out,), (out,)]
            inp = out
    return shapes + [(1000, 2048), (1000,)]


def gpt2_small_shapes():
    d, layers, vocab, ctx = 768, 12, 50257, 1024
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [
            (d,),
            (d,),
            (3 * d, d),
            (3 * d,),
            (d, d),
            (d,),
            (d,),
            (d,),
            (4 * d, d),
            (4 * d,),
            (d, 4 * d),
            (d,),
        ]
    return shapes + [(d,), (d,)]


def make(shapes, dtype=torch.float32, device="cpu"):
    # Generated on the device itself: a 1e9-element set would take minutes through the host.
    g = torch.Generator(device=device).manual_seed(0)
    params = [torch.randn(s, generator=g, device=device).to(dtype).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, device=device).mul_(1e-3).to(dtype)
    return params


SET_KEYS = ("flat", "resnet50", "gpt2-small", "small", "bf16-params")


def step_bytes(shapes, state_dtype: str) -> int:
    """Bytes an AdamW step moves over fp32 params of `shapes` with the given moment format."""
    total = 0
    for s in shapes:
        n = torch.Size(s).numel()
        if state_dtype == "bf16":
            total += 20 * n
        elif state_dtype == "int8" and n >= 4096:
            total += 16 * n + 2 * 8 * -(-n // 256)  # absmax read and written, two moments
        else:
            total += 28 * n
    return total


def one_moment_step_bytes(shapes, state_dtype: str) -> int:
    """Bytes a Lion or SGD-momentum step moves over fp32 params of `shapes` (one moment)."""
    total = 0
    for s in shapes:
        n = torch.Size(s).numel()
        if state_dtype == "bf16":
            total += 16 * n
        elif state_dtype == "int8" and n >= 4096:
            total += 14 * n + 8 * -(-n // 256)  # absmax read and written
        else:
            total += 20 * n
    return total


OPTIMIZERS = ("adamw", "lion", "sgd")


def deepspeed_cpu_adamw():
    """DeepSpeed's CPU Adam (AVX-512/AVX2 C++ kernel, JIT-built) as an AdamW class, or None when
    DeepSpeed is not installed or cannot build its op here."""
    try:
        import logging

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # noqa: BLE001 - any import/build failure means "not available"
        print(f"DeepSpeed CPU Adam not available ({type(e).__name__}: {e}); skipped", flush=True)
        return None

    def make_opt(params, lr, **kw):
        return DeepSpeedCPUAdam(params, lr=lr, weight_decay=1e-2, adamw_mode=True)

    return make_opt


def one_moment_rows(h, group, opt_name, shapes, state_dtypes, dev, reps):
    """Lion or SGD-momentum rows of one parameter set: torch SGD as the anchor of SGD's group, then
    torchspeed's per state dtype."""
    n = sum(torch.Size(s).numel() for s in shapes)
    variants = []
    if opt_name == "sgd":
        torch_kw = dict(fused=True) if dev.startswith("cuda") else dict(foreach=True)
        label = "torch SGD " + next(iter(torch_kw))
        variants.append((label, torch.optim.SGD, dict(momentum=0.9, **torch_kw), "fp32", True))
    cls = torchspeed.optim.Lion if opt_name == "lion" else torchspeed.optim.SGD
    extra = {} if opt_name == "lion" else dict(momentum=0.9)
    for sd in state_dtypes:
        label = f"torchspeed {cls.__name__}" + ("" if sd == "fp32" else f" {sd} state")
        variants.append((label, cls, dict(state_dtype=sd, **extra), sd, False))
    entries = [
        dict(
            label=label,
            fn=opt_cls(make(shapes, device=dev), lr=1e-3, **kw).step,
            bytes_moved=one_moment_step_bytes(shapes, sd),
            anchor=anchor,
            params=len(shapes),
            elements=n,
        )
        for label, opt_cls, kw, sd, anchor in variants
    ]
    h.add_interleaved(group, entries, repeats=reps)
    del entries
    gc.collect()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="torchspeed bench optim", description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--quick", action="store_true", help="smaller flat set, fewer repeats (CI / demo)"
    )
    ap.add_argument(
        "--state-dtype",
        default="fp32,bf16,int8",
        help="comma-separated torchspeed AdamW state_dtype columns (fp32, bf16, int8)",
    )
    ap.add_argument(
        "--optimizers",
        default="adamw",
        help=f"comma-separated optimizers to run ({', '.join(OPTIMIZERS)}); lion and sgd get their "
        "own groups",
    )
    ap.add_argument(
        "--sets",
        default=",".join(SET_KEYS),
        help=f"comma-separated parameter sets to run ({', '.join(SET_KEYS)})",
    )
    args = ap.parse_args(argv)
    dev = args.device
    state_dtypes = [s for s in args.state_dtype.split(",") if s]
    for s in state_dtypes:
        if s not in ("fp32", "bf16", "int8"):
            ap.error(f"--state-dtype: {s!r} is not one of fp32, bf16, int8")
    optimizers = [s for s in args.optimizers.split(",") if s]
    for s in optimizers:
        if s not in OPTIMIZERS:
            ap.error(f"--optimizers: {s!r} is not one of {', '.join(OPTIMIZERS)}")
    only = [s for s in args.sets.split(",") if s]
    for s in only:
        if s not in SET_KEYS:
            ap.error(f"--sets: {s!r} is not one of {', '.join(SET_KEYS)}")
    reps = 3 if args.quick else 7
    flat = 20_000_000 if args.quick else 100_000_000
    if dev.startswith("cuda") and not args.quick:
        flat = 1_000_000_000
    g = torch.Generator().manual_seed(1)
    small = [(int(n),) for n in torch.randint(256, 4097, (10_000,), generator=g)]
    sets = [
        (key, name, shapes)
        for key, name, shapes in [
            ("flat", f"flat {flat / 1e6:.0f}M fp32", [(flat,)]),
            ("resnet50", "resnet50 161 t 25.6M", resnet50_shapes()),
            ("gpt2-small", "gpt2-small 148 t 124M", gpt2_small_shapes()),
            ("small", "10k small tensors", small),
        ]
        if key in only
    ]
    # Lion / SGD runs write their own results file beside AdamW's.
    others = [o for o in optimizers if o != "adamw"]
    h = Harness(
        "_".join(["bench_optim", *others]) if others else "bench_optim",
        "torchspeed bench optim " + " ".join(sys.argv[1:] if argv is None else argv),
        device=dev,
    )
    ds_adam = deepspeed_cpu_adamw() if dev == "cpu" and not args.quick else None
    for _, name, shapes in sets:
        n = sum(torch.Size(s).numel() for s in shapes)
        for opt_name in (o for o in optimizers if o != "adamw"):
            one_moment_rows(h, f"{name} · {opt_name}", opt_name, shapes, state_dtypes, dev, reps)
        if "adamw" not in optimizers:
            continue
        variants = [
            ("torch AdamW for-loop", dict(foreach=False), torch.optim.AdamW, True),
            ("torch AdamW foreach", dict(foreach=True), torch.optim.AdamW, True),
            ("torch AdamW fused", dict(fused=True), torch.optim.AdamW, True),
        ]
        if name.startswith("flat") and dev == "cpu":
            variants = variants[1:]  # the for-loop equals foreach on one tensor
        if ds_adam is not None:
            variants.append(("DeepSpeed CPUAdam (adamw)", {}, ds_adam, True))
        for sd in state_dtypes:
            label = "torchspeed AdamW" + ("" if sd == "fp32" else f" {sd} state")
            variants.append((label, dict(state_dtype=sd), torchspeed.optim.AdamW, False))
        # The slow references one after another; torch's fused AdamW and torchspeed's variants
        # round-robin (Harness.add_interleaved), so their ratios come from the same minutes.
        entries = []
        for label, kw, cls, anchor in variants:
            entry = dict(
                label=label,
                fn=cls(make(shapes, device=dev), lr=1e-3, **kw).step,
                bytes_moved=step_bytes(shapes, kw.get("state_dtype", "fp32")),
                anchor=anchor,
                params=len(shapes),
                elements=n,
            )
            if label == "torch AdamW fused" or entries:
                entries.append(entry)
                continue
            h.add(name, entry.pop("label"), entry.pop("fn"), repeats=reps, **entry)
            del entry
            gc.collect()
        h.add_interleaved(name, entries, repeats=reps)
        del entries
        gc.collect()
    if "bf16-params" not in only:
        h.finish()
        return 0
    # (d) bf16 params + bf16 grads with fp32 masters (28 B/param) vs torch fused AdamW on bf16
    # params (no master: bf16 moments, 14 B/param, less accurate) and fp32 torch fused (28 B).
    shapes = gpt2_small_shapes()
    n = sum(torch.Size(s).numel() for s in shapes)
    name = "gpt2-small bf16 params"
    params = make(shapes, dtype=torch.bfloat16, device=dev)
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    h.add(
        name,
        "torch fused AdamW bf16 (no master)",
        opt.step,
        bytes_moved=14 * n,
        repeats=reps,
        anchor=True,
    )
    del opt, params
    params = make(shapes, device=dev)
    opt = torch.optim.AdamW(params, lr=1e-3, fused=True)
    h.add(
        name,
        "torch fused AdamW fp32 params",
        opt.step,
        bytes_moved=28 * n,
        repeats=reps,
        anchor=True,
    )
    del opt, params
    params = make(shapes, dtype=torch.bfloat16, device=dev)
    opt = torchspeed.optim.AdamW(params, lr=1e-3)
    h.add(name, "torchspeed AdamW bf16+fp32 master", opt.step, bytes_moved=28 * n, repeats=reps)
    del opt, params
    gc.collect()
    h.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
