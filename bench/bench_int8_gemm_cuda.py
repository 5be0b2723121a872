"""Shim: the benchmark ships in the package (torchspeed.benchmarks.int8_gemm_cuda); same as `torchspeed bench int8_gemm_cuda`."""

import sys

from torchspeed.benchmarks import run

if __name__ == "__main__":
    sys.exit(run("int8_gemm_cuda", sys.argv[1:]))
