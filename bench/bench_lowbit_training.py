"""Shim: the benchmark ships in the package (torchspeed.benchmarks.lowbit_training); same as `torchspeed bench lowbit_training`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("lowbit_training", sys.argv[1:]))
