"""python -m torchspeed.benchmarks NAME [args]: the same as `torchspeed bench NAME [args]`."""

import sys

from torchspeed.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
