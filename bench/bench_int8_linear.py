"""Shim: the benchmark ships in the package (torchspeed.benchmarks.int8_linear); same as `torchspeed bench int8_linear`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("int8_linear", sys.argv[1:]))
