"""Shim: the benchmark ships in the package (torchspeed.benchmarks.ddp); same as `torchspeed bench ddp`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("ddp", sys.argv[1:]))
