"""What tests in every folder share without being fixtures: the CPU ISA levels this machine
can run and why a CUDA test cannot. Imported as `from support import ...` (never from
conftest: each test folder may have its own conftest.py, so that name is ambiguous)."""

import torch

import torchspeed

# The levels every op's test runs on. avx512_vnni and amx differ from avx512 only in the int8
# Linear's kernels, so only its tests run them (the `int8_path` fixture).
_ORDER = ["scalar", "avx2", "avx512"]
_ALL = _ORDER + ["avx512_vnni", "amx"]
# The int8 Linear's kernel path of each level.
INT8_PATHS = {
    "scalar": "scalar",
    "avx2": "avx2",
    "avx512": "avx512",
    "avx512_vnni": "avx512_vnni",
    "amx": "amx",
}


def runnable_isas():
    compiled = torchspeed._C.cpu_isas_compiled().split(",")
    best = _ALL.index(torchspeed._C.cpu_isa_detected())
    return [isa for isa in _ALL if isa in compiled and _ALL.index(isa) <= best]


def cuda_skip_reason():
    """Why the CUDA variant of a test cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if not getattr(torchspeed._C, "with_cuda", False):
        return "torchspeed built without CUDA"
    return None
