"""The `torchspeed` command: `torchspeed info`, `torchspeed bench NAME` (one benchmark against its
torch anchor; `torchspeed bench --list`), `torchspeed demo` (until the training demo lands: the
optimizer, grad_stats and loader benchmarks side by side with their torch anchors).

Every benchmark ships in the package (torchspeed.benchmarks), so these work after a plain
`pip install` from any folder; results go to $TORCHSPEED_RESULTS_DIR, else ./torchspeed_results.
"""

import argparse

from . import benchmarks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="torchspeed", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="build and run-time information (python -m torchspeed.info)")
    b = sub.add_parser(
        "bench",
        help="run one benchmark against its torch anchor",
        epilog="benchmarks: " + "; ".join(f"{k}: {v[1]}" for k, v in benchmarks.BENCHMARKS.items()),
    )
    b.add_argument("name", choices=list(benchmarks.BENCHMARKS), metavar="NAME")
    b.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own (NAME --help)")
    d = sub.add_parser("demo", help="the main job: torchspeed vs torch, side by side")
    d.add_argument(
        "--full", action="store_true", help="full-size sets (minutes) instead of --quick"
    )
    args, extra = ap.parse_known_args(argv)
    if args.cmd == "info":
        from . import info

        return info.main(extra)
    if args.cmd == "bench":
        return benchmarks.run(args.name, args.args + extra)
    quick = [] if args.full else ["--quick"]
    print("torchspeed demo: fused optimizer step, gradient statistics and the loader vs torch\n")
    status = 0
    for i, name in enumerate(("optim", "grad_stats", "loader")):
        if i:
            print()
        status |= benchmarks.run(name, quick + extra)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
