"""Shim: the benchmark ships in the package (torchspeed.benchmarks.quant); same as `torchspeed bench quant`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("quant", sys.argv[1:]))
