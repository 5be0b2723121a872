"""Shim: the benchmark ships in the package (torchspeed.benchmarks.optim); same as `torchspeed bench optim`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("optim", sys.argv[1:]))
