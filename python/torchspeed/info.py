"""`python -m torchspeed.info`: what this torchspeed was built with and what it finds at run time."""

import argparse
import json
import os
import platform
import sys


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def collect() -> dict:
    import torch

    import torchspeed
    from torchspeed import _C

    built = dict(torchspeed.build_info)
    cpu_model = cpu_model_name()
    try:
        isa_now = _C.cpu_isa()
    except RuntimeError as e:  # a bad TORCHSPEED_CPU_ISA
        isa_now = f"error: {e}"
    int8_path = None
    if hasattr(_C, "cpu_int8_path"):
        try:
            int8_path = _C.cpu_int8_path()
        except RuntimeError as e:  # a bad TORCHSPEED_CPU_ISA
            int8_path = f"error: {e}"
        amx = _C.cpu_amx_status()
        if amx and not int8_path.startswith("error"):
            int8_path = f"{int8_path} (no amx: {amx})"
    return {
        "torchspeed": built.get("version"),
        "torch_built_against": built.get("torch_version"),
        "torch_running": torch.__version__,
        "cuda_compiled": built.get("cuda"),
        "cuda_architectures": built.get("cuda_architectures"),
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_isas_compiled": _C.cpu_isas_compiled().split(","),
        "cpu_isa_detected": _C.cpu_isa_detected(),
        "cpu_isa_selected": isa_now,
        "cpu_isa_env": os.environ.get("TORCHSPEED_CPU_ISA"),
        "int8_path": int8_path,
        "cpu_model": cpu_model,
        "cpu_threads": torch.get_num_threads(),
        "features": built.get("features", []),
        "build_options": [f"{k}={v}" for k, v in built.get("options", {}).items()],
        "compiler": built.get("cxx_compiler"),
        "build_type": built.get("build_type"),
        "sanitize": built.get("sanitize") or None,
        "python": platform.python_version(),
        "cmake_prefix_path": torchspeed.cmake_prefix_path,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchspeed.info", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "-"
        print(f"{key:<{width}}  {value if value is not None else '-'}")
    return 0


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `python -m torchspeed.info | head -1`
        from ._cli_args import quiet_broken_pipe

        quiet_broken_pipe()
        status = 1
    raise SystemExit(status)
