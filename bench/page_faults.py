"""Page faults in forward+backward, with glibc's malloc as it comes and with the doctor's malloc
fix (docs/PROFILE.md, the `malloc` rule): the demo's SmallResNet at its batch (64 x 3 x 64 x 64)
on one thread, float32 and bf16 autocast, after a few AdamW steps have churned the heap. Each
setting runs in its own child process (the fix cannot be undone in a process, and glibc reads
the environment variables at start). Prints a table and writes page_faults.json to
TORCHSPEED_RESULTS_DIR (default: ./torchspeed_results).

    python bench/page_faults.py [--processes 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from torchspeed.benchmarks.harness import machine_info, results_dir
from torchspeed.profile import malloc

_CHILD = r"""
import json, resource, statistics, time, torch
from torchspeed.demo import train
torch.set_num_threads(1)
torch.manual_seed(0)
m = train.SmallResNet(10, 16).train()
x = torch.randn(64, 3, 64, 64)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
for _ in range(5):  # the heap as a training loop leaves it
    m(x).square().mean().backward(); opt.step(); opt.zero_grad()
def one(bf16):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = m(x)
    out.float().square().mean().backward()
    m.zero_grad(set_to_none=True)
    t, r1 = time.thread_time() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return t, r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime
one(False); one(True)
res = {"fp32": [], "bf16": []}
for _ in range(9):
    for k in res:
        res[k].append(one(k == "bf16"))
print(json.dumps({k: [statistics.median(c[i] for c in v) for i in range(3)] for k, v in res.items()}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=5, help="child processes per setting")
    args = ap.parse_args(argv)
    env_fix = dict(item.split("=") for item in malloc.ENV_FIX.split())
    settings = {"as it comes": {}, "malloc fix": env_fix}
    rows = []
    for name, extra in settings.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(extra)
        for p in range(args.processes):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            rows.append({"setting": name, "process": p, **r})
    print(f"{machine_info()['cpu_model']}; forward+backward on one thread, medians of 9")
    head = (
        f"{'setting':<12} {'fp32 ms':>8} {'faults':>7} {'sys ms':>7} {'bf16 ms':>8} {'faults':>7}"
    )
    print(head + f" {'sys ms':>7} {'bf16/fp32':>9}")
    for r in rows:
        f, b = r["fp32"], r["bf16"]
        print(
            f"{r['setting']:<12} {1e3 * f[0]:>8.1f} {f[1]:>7.0f} {1e3 * f[2]:>7.1f} "
            f"{1e3 * b[0]:>8.1f} {b[1]:>7.0f} {1e3 * b[2]:>7.1f} {b[0] / f[0]:>9.3f}"
        )
    for name in settings:
        ratios = [r["bf16"][0] / r["fp32"][0] for r in rows if r["setting"] == name]
        print(
            f"{name}: bf16/fp32 median {statistics.median(ratios):.3f} over {len(ratios)} processes"
        )
    path = os.path.join(results_dir(), "page_faults.json")
    with open(path, "w") as fh:
        json.dump(
            {"machine": machine_info(), "env_fix": malloc.ENV_FIX, "rows": rows}, fh, indent=1
        )
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
