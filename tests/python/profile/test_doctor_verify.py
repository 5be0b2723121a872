"""`torchspeed doctor --verify`: the script's first steps as it is, then once per applicable fix
applied from outside; each fix's measured gain beside its estimate and the loss drift."""

import io
import textwrap

import torch
from profile_helpers import _assert_hooks_removed

from torchspeed.profile import _doctor

_SCRIPT = """
import time, torch
from torch import nn
torch.manual_seed(0)
class DS(torch.utils.data.Dataset):
    def __len__(self): return 16 * 12
    def __getitem__(self, i):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.001: pass   # per-sample decode + augmentation
        return torch.randn(64), i % 10
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
loader = torch.utils.data.DataLoader(DS(), batch_size=16)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad()
print("done")
"""


def test_verify_measures_each_applicable_fix_beside_its_estimate(tmp_path, monkeypatch, capfd):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert _doctor.run_verify(["python", str(script)], steps=5, file=out) == 0
    text = out.getvalue()
    assert "done" not in capfd.readouterr().out  # the runs' stdout is dropped
    rows = {line[2:38].strip(): line for line in text.splitlines()[2:]}
    assert "as the script is" in rows, text
    # clip_grad_norm_ + torch's AdamW: torchspeed's AdamW with the clip folded in; same math,
    # so the loss hardly drifts (the fused step rounds differently: well under 0.1 %).
    opt_row = rows["torchspeed optimizer + max_grad_norm"]
    drift = float(opt_row.split()[-2])
    assert drift < 0.1, opt_row
    # num_workers=0 with 16 ms of per-batch work in the training process: more workers, and the
    # headspace run (the data in memory) whose gain is about the whole data wait.
    assert any(k.endswith("loader workers") for k in rows), text
    head = rows["headspace (data in memory)"]
    gain_ms = float(head.split("ms")[1].split()[-1])
    assert gain_ms > 8.0, head  # 16 samples x 1 ms of busy work per batch, less noise
    _assert_hooks_removed()
    for name in ("AdamW", "SGD", "Adam"):
        assert getattr(torch.optim, name).__module__.startswith("torch.optim")
