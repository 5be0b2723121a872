"""The `torchspeed` command: `torchspeed info`, `torchspeed bench {optim,grad_stats,loader}`,
`torchspeed demo` (until the training demo lands: the optimizer, grad_stats and loader benchmarks
side by side with their torch anchors)."""

import argparse
import os
import runpy
import sys

# The bench scripts live in the source checkout: the current directory's bench/ (a regular
# install run from the repository root), or the one beside the package (an editable install).
_BENCH_DIRS = (
    os.path.join(os.getcwd(), "bench"),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"),
)


def _run_bench(name: str, extra) -> None:
    candidates = [os.path.join(d, f"bench_{name}.py") for d in _BENCH_DIRS]
    path = next((c for c in candidates if os.path.exists(c)), None)
    if path is None:
        raise SystemExit(
            f"torchspeed bench: bench_{name}.py not found in {' or '.join(_BENCH_DIRS)}; "
            "benchmarks run from the root of a source checkout"
        )
    sys.argv = [path, *extra]
    runpy.run_path(path, run_name="__main__")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="torchspeed", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="build and run-time information (python -m torchspeed.info)")
    b = sub.add_parser("bench", help="run one benchmark against its torch anchor")
    b.add_argument("name", choices=["optim", "grad_stats", "loader"])
    d = sub.add_parser("demo", help="the main job: torchspeed vs torch, side by side")
    d.add_argument(
        "--full", action="store_true", help="full-size sets (minutes) instead of --quick"
    )
    args, extra = ap.parse_known_args(argv)
    if args.cmd == "info":
        from . import info

        return info.main(extra)
    if args.cmd == "bench":
        _run_bench(args.name, extra)
        return 0
    quick = [] if args.full else ["--quick"]
    print("torchspeed demo: fused optimizer step and gradient statistics vs their torch anchors\n")
    _run_bench("optim", quick + extra)
    print()
    _run_bench("grad_stats", quick + extra)
    print()
    _run_bench("loader", quick + extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
