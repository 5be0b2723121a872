"""The fused AdamW under automatic mixed precision with torch.amp.GradScaler.

    python examples/python/optim_amp.py                 # CUDA: fp16 autocast; CPU: fp16 too
    python examples/python/optim_amp.py --quick         # a few steps (what CI runs)

torchspeed.optim.AdamW is a drop-in for torch.optim.AdamW: the same arguments, the same state dict.
Under a GradScaler, `scaler.step(opt)` hands the scale and the inf flag to the fused kernel, which
unscales the gradients in registers and skips the update on overflow (no host sync on CUDA). The
script trains the same model twice from the same initial weights, once with torch.optim.AdamW and
once with torchspeed's, and checks that both end at the same parameters, then that a state dict
moves between the two. It also shows master weights for bf16 params and the clip in the same pass.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch import nn

import torchspeed


def train(model: nn.Module, opt, device: str, steps: int, seed: int = 0) -> list:
    scaler = torch.amp.GradScaler(device)  # fp16 needs loss scaling: small gradients underflow
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 32, generator=g).to(device)
        y = (x[:, :4].sum(1) > 0).long()  # a learnable target
        with torch.autocast(device, dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)  # torchspeed: unscale + inf/NaN skip inside the fused update
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="20 steps")
    args = ap.parse_args(argv)
    steps = 20 if args.quick else args.steps
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)).to(args.device)
    ref = copy.deepcopy(model)

    opt = torchspeed.optim.AdamW(
        model.parameters(), lr=3e-3, weight_decay=0.01
    )  # the one-line swap
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.01)
    losses = train(model, opt, args.device, steps)
    ref_losses = train(ref, ref_opt, args.device, steps)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} (torch.optim.AdamW: {ref_losses[-1]:.3f})")
    for p, q in zip(model.parameters(), ref.parameters()):
        # fp16 autocast rounds the same way in both; the update math differs only in float32
        # rounding order, so a loose tolerance after many steps.
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-3)
    print(f"after {steps} steps: the same parameters as torch.optim.AdamW (within 1e-3)")

    # State dicts are torch's format: resume a torch.optim run with torchspeed and back.
    ref_opt2 = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ref_opt2.load_state_dict(opt.state_dict())
    opt.load_state_dict(ref_opt2.state_dict())

    # bf16 params keep float32 master weights (default) and clip the global norm in the same pass.
    half = copy.deepcopy(model).to(torch.bfloat16)
    opt16 = torchspeed.optim.AdamW(half.parameters(), lr=1e-3, max_grad_norm=1.0)
    x = torch.randn(64, 32, device=args.device, dtype=torch.bfloat16)
    half(x).float().pow(2).mean().backward()
    opt16.step()
    state = opt16.state[next(iter(half.parameters()))]
    print(f"bf16 params, state kept in {sorted(state)} (float32 masters), clipped to norm 1.0")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
