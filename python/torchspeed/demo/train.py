"""The model and the training loop the demo runs for each configuration.

One loop for every run, so that only the parts differ: the loader (torch's DataLoader + PIL, or
torchspeed's native WebDataset loader), the optimizer (torch.optim.AdamW or torchspeed's fused
AdamW), device prefetch, and, for the third run, the doctor's torch-level fixes. Every run is
profiled the same way (a StepProfiler with torch's hooks, phase ranges around each part of the
step), so the phase breakdowns compare like with like.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import resource
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import profile as tsp
from .._progress import progress_bar
from ..profile.verify import set_cudnn_benchmark
from . import baseline as bl
from .dataset import cpu_count


# ---- the model ---------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)), inplace=True)


class SmallResNet(nn.Module):
    """A ResNet-18-shaped net at 1/4 width and 4 blocks: stem conv (stride 2) + max pool, then
    stages of width w, 2w, 4w, 8w (stride 2 each after the first), global pool, linear."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        chans = [width, 2 * width, 4 * width, 8 * width]
        blocks, cin = [], width
        for i, c in enumerate(chans):
            blocks.append(BasicBlock(cin, c, 1 if i == 0 else 2))
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ---- configuration -----------------------------------------------------------------------------
@dataclass
class Config:
    device: str
    steps: int
    batch_size: int
    image_size: int
    workers: int
    lr: float = 2e-3
    weight_decay: float = 0.05
    seed: int = 0
    amp: str = "off"  # off | bf16 | fp16 (fp16 uses a GradScaler)
    width: int = 16
    scale: tuple = (0.25, 1.0)
    decode_scaling: Any = "fast"
    progress: bool = True

    @property
    def resize_size(self) -> int:  # ImageNet's 256/224 for the held-out resize + center crop
        return int(round(self.image_size * 8 / 7))


@dataclass
class RunResult:
    name: str
    label: str
    wall_s: float
    steps: int
    images: int
    losses: List[float]
    times_s: List[float]
    heldout_acc: float
    heldout_images: int
    eval_s: float
    summary: Any  # torchspeed.profile.StepSummary
    report: str
    phase_total_s: Dict[str, float]
    first_batch_s: float
    cpu_s: float
    setup_s: float = math.nan  # building the loaders (the baseline's index scan, the native index)
    notes: List[str] = field(default_factory=list)
    profiler: Any = None

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s

    @property
    def step_times_s(self) -> List[float]:
        """Each step's wall time (data wait included), from the cumulative ``times_s``."""
        t = [0.0] + list(self.times_s)
        return [b - a for a, b in zip(t, t[1:])]

    def step_stats(self) -> Dict[str, float]:
        """Median, p90 and max of the per-step wall times (every step, step 0 included), and the
        seconds the steps slower than 3x the median spent beyond the median: the part of the
        wall time that a few stalled steps (machine load, a start-up transient) added."""
        d = sorted(self.step_times_s)
        if not d:
            return dict(
                median_s=math.nan,
                p90_s=math.nan,
                max_s=math.nan,
                slow_steps=0,
                slow_excess_s=math.nan,
            )
        med = d[len(d) // 2]
        slow = [x for x in d if x > 3 * med]
        return dict(
            median_s=med,
            p90_s=d[min(len(d) - 1, int(0.9 * len(d)))],
            max_s=d[-1],
            slow_steps=len(slow),
            slow_excess_s=sum(x - med for x in slow),
        )

    @property
    def final_loss(self) -> float:
        """Mean train loss over the last 10 % of the steps (at least 1)."""
        k = max(1, len(self.losses) // 10)
        return sum(self.losses[-k:]) / k


def _autocast(cfg: Config):
    if cfg.amp == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float16
    return torch.autocast(torch.device(cfg.device).type, dtype=dtype)


# ---- loaders -----------------------------------------------------------------------------------
def _torch_loaders(cfg: Config, manifest: dict, seed: int):
    cuda = torch.device(cfg.device).type == "cuda"
    train = bl.TarShardDataset(
        manifest["train_urls"], bl.train_transform(cfg.image_size, cfg.scale)
    )
    common = dict(
        num_workers=cfg.workers,
        pin_memory=cuda,
        persistent_workers=cfg.workers > 0,
    )
    dl = torch.utils.data.DataLoader(
        train,
        batch_size=cfg.batch_size,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
        **common,
    )
    val = bl.TarShardDataset(
        manifest["val_urls"], bl.eval_transform(cfg.image_size, cfg.resize_size)
    )
    vdl = torch.utils.data.DataLoader(val, batch_size=2 * cfg.batch_size, **common)
    return dl, vdl


def _native_loaders(cfg: Config, manifest: dict, seed: int, channels_last: bool = False):
    from ..data import DataLoader, WebDataset

    cuda = torch.device(cfg.device).type == "cuda"
    # On a GPU the loader ships uint8 (4x fewer bytes to copy) and the GPU normalizes; on the CPU
    # the C++ threads normalize to float32 while decoding.
    img = dict(
        size=cfg.image_size,
        dtype=torch.uint8 if cuda else torch.float32,
        normalize=not cuda,
        channels_last=channels_last and not cuda,
        decode_scaling=cfg.decode_scaling,
    )
    train = WebDataset(
        manifest["train_urls"],
        fields=("jpg", "cls"),
        crop="random_resized_crop",
        scale=cfg.scale,
        flip_prob=0.5,
        **img,
    )
    dev = cfg.device if cuda else None
    dl = DataLoader(
        train,
        batch_size=cfg.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=cfg.workers,
        seed=seed,
        persistent_workers=True,
        device=dev,
    )
    val = WebDataset(
        manifest["val_urls"],
        fields=("jpg", "cls"),
        crop="resize_center_crop",
        resize_size=cfg.resize_size,
        **img,
    )
    vdl = DataLoader(
        val, batch_size=2 * cfg.batch_size, num_workers=cfg.workers, seed=seed, device=dev
    )
    return dl, vdl


class _GpuNormalize:
    """uint8 NCHW (or NHWC) on the GPU -> normalized float, as the C++ loader does on a CPU."""

    def __init__(self, device, channels_last: bool):
        self.mean = torch.tensor(bl.IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.inv_std = 1 / (torch.tensor(bl.IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255)
        self.channels_last = channels_last

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().sub_(self.mean).mul_(self.inv_std)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


def _lr_factor(steps: int):
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))

    return factor


def _model_input(x: torch.Tensor, prepare, channels_last: bool) -> torch.Tensor:
    if prepare is not None:  # uint8 on the GPU -> normalized float
        return prepare(x)
    if channels_last:  # the C++ loader wrote NHWC: the same memory seen as NCHW channels_last
        return (
            x.permute(0, 3, 1, 2)
            if x.shape[-1] == 3
            else x.contiguous(memory_format=torch.channels_last)
        )
    return x


# ---- one run -----------------------------------------------------------------------------------
def run(kind: str, cfg: Config, manifest: dict, advice_rules: Sequence[str] = ()) -> RunResult:
    """kind: "baseline" (idiomatic PyTorch), "torchspeed", or "doctor_fixes" (torchspeed plus the
    doctor's torch-level advice: channels_last, cudnn.benchmark on CUDA, and bf16 autocast on a
    CPU when the doctor's "amp" rule fired on the baseline, torch.set_num_threads when its
    "cpu_threads" rule did, listed in ``advice_rules``)."""
    # The doctor's fixes change process-wide settings (torch's threads, cudnn.benchmark): put
    # them back after the run, also when it raises.
    threads, benchmark = torch.get_num_threads(), torch.backends.cudnn.benchmark
    try:
        return _run(kind, cfg, manifest, advice_rules)
    finally:
        torch.set_num_threads(threads)
        if torch.backends.cudnn.benchmark != benchmark:
            set_cudnn_benchmark(benchmark)


def _run(kind: str, cfg: Config, manifest: dict, advice_rules: Sequence[str]) -> RunResult:
    labels = {
        "baseline": "PyTorch (DataLoader+PIL, torch AdamW)",
        "torchspeed": "torchspeed (native loader, fused AdamW)",
        "doctor_fixes": "torchspeed + doctor's fixes",
    }
    device = torch.device(cfg.device)
    cuda = device.type == "cuda"
    fixes = kind == "doctor_fixes"
    cl = False  # channels_last model and inputs
    notes: List[str] = []
    torch.manual_seed(cfg.seed)
    model = SmallResNet(len(manifest["classes"]), cfg.width).to(device)
    if fixes:
        # What the doctor advised for the baseline run, each measured on this machine first on
        # the CPU (profile/probe.py); `torchspeed doctor --verify` checks the same fixes.
        cl = "channels_last" in advice_rules
        if cl:
            notes.append("channels_last model and inputs (the doctor's channels_last advice)")
        else:
            notes.append("NCHW: the doctor did not advise channels_last")
        if cuda:
            set_cudnn_benchmark(True)
            notes.append("cudnn.benchmark")
        if "amp" in advice_rules and cfg.amp == "off":
            cfg = dataclasses.replace(cfg, amp="fp16" if cuda else "bf16")
            notes.append(f"autocast {cfg.amp} (the doctor's amp advice)")
        elif "amp_not_advised" in advice_rules:
            notes.append("float32: the doctor does not advise bf16 autocast on this CPU")
        if "cpu_threads" in advice_rules and not cuda:
            # As the doctor's advice says: leave the loader's decode threads a core each.
            n = max(1, cpu_count() - cfg.workers)
            torch.set_num_threads(n)
            notes.append(f"torch.set_num_threads({n}) (the doctor's cpu_threads advice)")
        if cl:
            model = model.to(memory_format=torch.channels_last)
    hyper = dict(lr=cfg.lr, weight_decay=cfg.weight_decay)
    t_setup = time.perf_counter()
    if kind == "baseline":
        opt = torch.optim.AdamW(model.parameters(), **hyper)
        dl, vdl = _torch_loaders(cfg, manifest, cfg.seed)
        prepare = None
    else:
        from ..optim import AdamW

        opt = AdamW(model.parameters(), **hyper)
        dl, vdl = _native_loaders(cfg, manifest, cfg.seed, channels_last=cl)
        prepare = _GpuNormalize(device, cl) if cuda else None
    # Reported next to the training wall time, not inside it (the same rule for every run).
    setup_s = time.perf_counter() - t_setup
    # The same schedule in every run (torch's LambdaLR drives either optimizer): linear warmup
    # over 5 % of the steps, then cosine to 0, so each run ends at a settled model, not at a
    # point of a noisy constant-lr walk (held-out accuracy then compares the runs, not the noise).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor(cfg.steps))
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    to_device = kind == "baseline" and cuda  # torchspeed's loader prefetches on a side stream

    prof = tsp.StepProfiler(
        hooks=True,
        device="cuda" if cuda else "cpu",
        warmup=min(5, cfg.steps // 5),
        probe=kind == "baseline",  # the doctor's measured estimates, for the third run's fixes
    )
    bar = _bar(cfg.steps, cfg.progress, labels[kind])
    losses: List[torch.Tensor] = []
    times: List[float] = []
    first_batch_s = math.nan
    model.train()
    if cuda:
        torch.cuda.synchronize()
    cpu0 = _process_cpu_s()
    t0 = time.perf_counter()
    step, epoch = 0, 0
    with prof:
        while step < cfg.steps:
            if hasattr(dl, "set_epoch"):
                dl.set_epoch(epoch)
            it = iter(dl)
            while step < cfg.steps:
                with tsp.phase("data_wait"):
                    batch = next(it, None)
                if batch is None:
                    break
                if step == 0:
                    first_batch_s = time.perf_counter() - t0
                x, y = batch
                if to_device:
                    with tsp.phase("h2d"):
                        x = x.to(device, non_blocking=True)
                        y = y.to(device, non_blocking=True)
                with tsp.phase("forward"):
                    x = _model_input(x, prepare, cl)
                    with _autocast(cfg):
                        loss = F.cross_entropy(model(x), y)
                with tsp.phase("backward"):
                    scaler.scale(loss).backward()
                with tsp.phase("optimizer"):
                    scaler.step(opt)
                    scaler.update()
                    opt.zero_grad(set_to_none=True)
                    sched.step()
                losses.append(loss.detach())
                times.append(time.perf_counter() - t0)
                prof.step(samples=int(y.shape[0]))
                step += 1
                if not cuda or step % 20 == 0 or step == cfg.steps:
                    bar.set_postfix(loss=f"{float(loss.detach()):.3f}", refresh=False)
                bar.update(1)
            epoch += 1
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    # CPU seconds the training spent: this process's threads (the C++ loader's included) plus
    # torch's worker processes. It counts spinning and contention too (torch's OpenMP threads
    # spin while they wait), so on a loaded machine it grows with the load, as wall time does.
    cpu_s = _process_cpu_s() - cpu0 + _worker_cpu_s(dl)
    bar.close()
    summary = prof.summary()
    report = prof.report(summary)
    hist = prof.history()
    phase_total = {p: sum(v) / 1e9 for p, v in hist.phase_ns.items()}
    loss_values = torch.stack(losses).float().cpu().tolist()

    # Held-out accuracy, each run with its own pipeline (resize + center crop), not timed above.
    t1 = time.perf_counter()
    correct = total = 0
    model.eval()
    with torch.no_grad(), _autocast(cfg):
        for x, y in vdl:
            if to_device:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            x = _model_input(x, prepare, cl)
            correct += int((model(x).argmax(1) == y).sum())
            total += int(y.shape[0])
    eval_s = time.perf_counter() - t1
    _close(dl)
    _close(vdl)
    return RunResult(
        name=kind,
        label=labels[kind],
        wall_s=wall,
        steps=len(loss_values),
        images=len(loss_values) * cfg.batch_size,
        losses=loss_values,
        times_s=times,
        heldout_acc=correct / max(1, total),
        heldout_images=total,
        eval_s=eval_s,
        summary=summary,
        report=report,
        phase_total_s=phase_total,
        first_batch_s=first_batch_s,
        cpu_s=cpu_s,
        setup_s=setup_s,
        notes=notes,
        profiler=prof,
    )


def warm_up(cfg: Config, num_classes: int, steps: int = 2, channels_last: bool = False) -> float:
    """A few untimed forward/backward/optimizer steps of a throwaway model on random inputs, in
    the layouts the runs will use (channels_last only with the doctor's fixes) and the run's
    autocast, before any timed run.

    The process's one-time costs (oneDNN/cuDNN primitive creation for each layer shape, the
    intra-op thread pool's start, the allocator growing its arenas, CUDA context and kernel
    loading) otherwise fall into the timed steps of whichever run goes first (the baseline), which
    made the order of the runs part of the comparison. Returns the seconds it took."""
    device = torch.device(cfg.device)
    t0 = time.perf_counter()
    for cl in (False, True) if channels_last else (False,):
        torch.manual_seed(cfg.seed + 1)
        model = SmallResNet(num_classes, cfg.width).to(device)
        if cl:
            model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        for _ in range(steps):
            x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, device=device)
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, num_classes, (cfg.batch_size,), device=device)
            with _autocast(cfg):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _process_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _worker_cpu_s(dl) -> float:
    """User + system CPU seconds of torch's (persistent) worker processes so far (Linux /proc)."""
    it = getattr(dl, "_iterator", None)
    total = 0.0
    for w in getattr(it, "_workers", None) or []:
        try:
            with open(f"/proc/{w.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return math.nan
    return total


def _close(dl) -> None:
    if hasattr(dl, "shutdown"):
        dl.shutdown()
    it = getattr(dl, "_iterator", None)  # torch's persistent workers
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def _bar(total: int, enabled: bool, desc: str):
    return progress_bar(total, desc, "step", enabled=enabled)
