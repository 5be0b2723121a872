"""Shim: the benchmark ships in the package (torchspeed.benchmarks.grad_stats); same as `torchspeed bench grad_stats`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("grad_stats", sys.argv[1:]))
