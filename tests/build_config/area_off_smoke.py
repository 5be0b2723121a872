"""Smoke test of a torchspeed built with one optional area OFF (scripts/check_areas_off.sh runs it
against that build): every module imports, the areas built work against a torch reference, and the
missing area raises the one "area not built" error naming its build option.

    python tests/build_config/area_off_smoke.py <SWITCH>     # DATA, DIST, QUANT or PRUNE
"""

import importlib
import pkgutil
import sys

import torch


def _expect_not_built(call, switch: str) -> None:
    from torchspeed._native import AreaNotBuiltError

    try:
        call()
    except AreaNotBuiltError as e:
        assert f"TORCHSPEED_WITH_{switch}" in str(e), str(e)
        return
    raise AssertionError(f"no AreaNotBuiltError naming TORCHSPEED_WITH_{switch}")


def _check_optim() -> None:
    import torchspeed

    torch.manual_seed(0)
    p0 = torch.randn(1000, dtype=torch.float32)
    g = torch.randn(1000, dtype=torch.float32)
    a, b = p0.clone().requires_grad_(), p0.clone().requires_grad_()
    ours = torchspeed.optim.AdamW([a], lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    stats = torchspeed.ops.grad_stats([g])
    torch.testing.assert_close(stats.total_norm.double(), g.double().norm(), rtol=1e-5, atol=0)


def _check_profile() -> None:
    import torchspeed

    with torchspeed.profile.range("area_off_smoke"):
        torch.ones(3).sum()


def _check_data() -> None:
    import torchspeed

    x = torch.arange(24, dtype=torch.float32).reshape(12, 2)
    y = torch.arange(12)
    loader = torchspeed.data.DataLoader(
        torchspeed.data.TensorSource(x, y), batch_size=4, num_workers=2
    )
    got = [batch for batch in loader]
    torch.testing.assert_close(torch.cat([b[0] for b in got]), x, rtol=0, atol=0)


def _use_data():
    import torchspeed

    x = torch.zeros(4, 2)
    next(iter(torchspeed.data.DataLoader(torchspeed.data.TensorSource(x), batch_size=2)))


def _check_dist() -> None:
    import torchspeed

    src = torch.randn(100)
    out = torch.empty(100, dtype=torch.bfloat16)
    torchspeed.ops.scale_cast_(out, src, 0.5)
    torch.testing.assert_close(out, (src * 0.5).bfloat16(), rtol=0, atol=0)


def _use_dist():
    import torchspeed

    torchspeed.ops.scale_cast_(torch.zeros(4), torch.zeros(4), 1.0)


def _check_quant() -> None:
    import torchspeed

    x = torch.randn(64)
    scale = torch.tensor([0.05])
    q = torchspeed.quant.quantize_int8(x, scale)
    ref = torch.clamp(torch.round(x * (1 / scale)), -128, 127).to(torch.int8)
    torch.testing.assert_close(q, ref, rtol=0, atol=0)


def _use_quant():
    import torchspeed

    torchspeed.quant.quantize_int8(torch.zeros(4), torch.tensor([1.0]))


def _check_prune() -> None:
    import torchspeed

    w = torch.randn(8, 16)
    mask = torchspeed.ops.unpack_mask(torchspeed.ops.nm_mask(w, 2, 4), w.shape)
    kept = mask.reshape(-1, 4).sum(dim=1)
    assert bool((kept == 2).all()), kept


def _use_prune():
    import torchspeed

    torchspeed.ops.nm_mask(torch.randn(4, 4), 2, 4)


CHECKS = {"DATA": _check_data, "DIST": _check_dist, "QUANT": _check_quant, "PRUNE": _check_prune}
USES = {"DATA": _use_data, "DIST": _use_dist, "QUANT": _use_quant, "PRUNE": _use_prune}


def main(switch: str) -> int:
    import torchspeed

    options = torchspeed.build_info["options"]
    assert options[f"TORCHSPEED_WITH_{switch}"] == "OFF", options
    # Every module imports in a build without the area (errors come when it is used).
    for mod in pkgutil.walk_packages(torchspeed.__path__, "torchspeed."):
        if mod.name.endswith("__main__"):
            continue
        importlib.import_module(mod.name)
    _check_optim()
    _check_profile()
    for other, check in CHECKS.items():
        if other != switch and options.get(f"TORCHSPEED_WITH_{other}") == "ON":
            check()
    _expect_not_built(USES[switch], switch)
    print(
        f"area_off_smoke: TORCHSPEED_WITH_{switch}=OFF ok (built: {torchspeed.build_info['features']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1].upper()))
