"""Shim: the benchmark ships in the package (torchspeed.benchmarks.loader_gpu); same as `torchspeed bench loader_gpu`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("loader_gpu", sys.argv[1:]))
