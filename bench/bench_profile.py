"""Shim: the benchmark ships in the package (torchspeed.benchmarks.profile); same as `torchspeed bench profile`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("profile", sys.argv[1:]))
