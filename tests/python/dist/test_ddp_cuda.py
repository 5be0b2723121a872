"""AccumulatingDDP over NCCL: a one-rank group on cuda:0 (skipped without a GPU or NCCL)."""

from __future__ import annotations

import pytest
import torch
from support import cuda_skip_reason
from dist_helpers import DIST_MISSING, F32, Net, window_data
from torch import nn

pytestmark = pytest.mark.skipif(DIST_MISSING is not None, reason=str(DIST_MISSING))


def test_nccl_world_size_one_on_the_gpu(tmp_path):
    """The NCCL path: a one-rank NCCL group on cuda:0, accumulation and compression, against the
    same training without the wrapper (GPU check script)."""
    import torch.distributed as dist

    from torchspeed.dist import AccumulatingDDP

    reason = cuda_skip_reason() or (None if dist.is_nccl_available() else "torch without NCCL")
    if reason:
        pytest.skip(reason)
    store = dist.FileStore(str(tmp_path / "nccl_store"), 1)
    group = dist.ProcessGroupNCCL(store, 0, 1)
    for compression in (None, "bf16"):
        net = Net(torch.float32).cuda()
        ref = Net(torch.float32).cuda()
        model = AccumulatingDDP(
            net, accumulation_steps=2, process_group=group, compression=compression
        )
        opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (net, ref))
        x, y = (t.cuda() for t in window_data(0, 1, 2, 8, torch.float32))
        for m, o in ((model, opt), (ref, ref_opt)):
            for j in range(2):
                nn.functional.mse_loss(m(x[0, j], use_side=True), y[0, j]).div(2).backward()
            o.step()
        tol = F32 if compression is None else dict(rtol=1e-2, atol=1e-3)
        for (n, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, **tol, msg=n)
        assert model.stats()["bucket_collectives"] == model.stats()["buckets"]


def test_nccl_zero1_world_size_one_on_the_gpu(tmp_path):
    """ZeRO-1 over NCCL (reduce-scatter and all-gather, as on GPUs): a one-rank group on cuda:0,
    ZeroOptimizer(torch.optim.SGD) against the same training without the wrapper (GPU check)."""
    import torch.distributed as dist

    from torchspeed.dist import AccumulatingDDP

    reason = cuda_skip_reason() or (None if dist.is_nccl_available() else "torch without NCCL")
    if reason:
        pytest.skip(reason)
    group = dist.ProcessGroupNCCL(dist.FileStore(str(tmp_path / "nccl_zero"), 1), 0, 1)
    net, ref = Net(torch.float32).cuda(), Net(torch.float32).cuda()
    model = AccumulatingDDP(net, accumulation_steps=2, process_group=group, zero=1)
    opt = model.zero_optimizer(torch.optim.SGD, lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        x, y = (t.cuda() for t in window_data(step, 1, 2, 8, torch.float32))
        for m, o in ((model, opt), (ref, ref_opt)):
            for j in range(2):
                nn.functional.mse_loss(m(x[0, j], use_side=True), y[0, j]).div(2).backward()
            o.step()
            o.zero_grad()
    for (n, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, **F32, msg=n)
    assert model.stats()["zero_collectives"] == "reduce_scatter"
