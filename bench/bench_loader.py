"""Shim: the benchmark ships in the package (torchspeed.benchmarks.loader); same as `torchspeed bench loader`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("loader", sys.argv[1:]))
