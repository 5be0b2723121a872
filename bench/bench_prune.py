"""Shim: the benchmark ships in the package (torchspeed.benchmarks.prune); same as `torchspeed bench prune`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("prune", sys.argv[1:]))
