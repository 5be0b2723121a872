"""``torchspeed demo``: trains the same small ResNet twice on the same cached JPEG shards, first
as idiomatic PyTorch (torch's DataLoader + PIL + torchvision-style transforms, torch.optim.AdamW),
then with torchspeed's parts (the native C++ loader with decode-time scaling, the fused AdamW,
device prefetch on a GPU, the step profiler), and shows the speedup side by side.

    torchspeed demo                       # about 9,000 + 1,000 images, cached on first use
    torchspeed demo --quick               # a CI-sized run (< 1 minute on 2 cores)
    python -m torchspeed.demo --device cuda --steps 600
    torchspeed demo --benchmarks          # the micro-benchmarks instead (torchspeed bench NAME)

Same seed, model, batch size, image size, hyperparameters, number of steps and autocast policy in
both runs. Prints a table (images/s, step time by phase, final train loss, held-out accuracy,
speedup) and the doctor's report for the baseline, and writes summary.json (every figure),
demo.png (loss against wall time, phase breakdown) and Chrome traces to --out. See docs/DEMO.md.
"""

from .cli import main

__all__ = ["main"]
