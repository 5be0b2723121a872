"""The `torchspeed` command: `torchspeed info`, `torchspeed bench NAME` (one benchmark against its
torch anchor; `torchspeed bench all` runs them all in their quick sizes), `torchspeed demo` (the
end-to-end training demo: the same small CNN trained as idiomatic PyTorch and with torchspeed,
side by side; `torchspeed demo --benchmarks`: the micro-benchmarks instead),
`torchspeed doctor [--steps N] -- python train.py ARGS` (profile an unmodified training script:
step breakdown and ranked advice).

Every benchmark ships in the package (torchspeed.benchmarks), so these work after a plain
`pip install` from any folder; results go to $TORCHSPEED_RESULTS_DIR, else ./torchspeed_results.
"""

import argparse
import sys

from . import benchmarks
from ._cli_args import int_at_least, output_folder, quiet_broken_pipe


def main(argv=None) -> int:
    """The command line; its output piped into a reader that stops early (`torchspeed info |
    head -1`) ends it quietly, as Unix tools do."""
    try:
        status = _main(argv)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        quiet_broken_pipe()
        return 1


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="torchspeed", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="build and run-time information (python -m torchspeed.info)")
    b = sub.add_parser(
        "bench",
        help="run one benchmark against its torch anchor",
        epilog="benchmarks: " + "; ".join(f"{k}: {v[1]}" for k, v in benchmarks.BENCHMARKS.items()),
    )
    b.add_argument("name", choices=[*benchmarks.BENCHMARKS, "all"], metavar="NAME")
    b.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own (NAME --help)")
    sub.add_parser(
        "demo",
        help="the main job: the same CNN trained as idiomatic PyTorch and with torchspeed, "
        "side by side (torchspeed demo --help)",
        add_help=False,
    )
    doc = sub.add_parser(
        "doctor",
        help="profile a training script: step breakdown and ranked advice",
        description="Runs the command after -- in this process with torch's hooks installed "
        "(each step of its first optimizer ends a step; in a loop without one, each iteration "
        "of forward and backward), then prints where the step time goes and what to change on "
        "stderr (the script's stdout stays its own), and writes report.txt, summary.json, "
        "trace.json (Perfetto) and steps.png to --out.",
    )
    doc.add_argument(
        "--steps",
        type=int_at_least(1),
        default=None,
        help="profile N steps, then report while the script runs on unprofiled (default: "
        "profile to the script's end)",
    )
    doc.add_argument(
        "--stop-script",
        action="store_true",
        help="with --steps: end the script after its N steps (as if it returned) instead",
    )
    doc.add_argument(
        "--warmup",
        type=int_at_least(0),
        default=1,
        help="steps left out of the summary (default 1)",
    )
    doc.add_argument(
        "--out",
        type=output_folder,
        default="torchspeed_doctor",
        help="output folder (default ./torchspeed_doctor)",
    )
    doc.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="timeline clock (default: cuda if available)",
    )
    doc.add_argument(
        "--verify",
        type=int_at_least(2),
        nargs="?",
        const=8,
        default=None,
        metavar="STEPS",
        help="check the advice: run the script's first STEPS steps (default 8) as it is, then "
        "once per applicable fix (bf16 autocast, torchspeed's optimizer, clip_grad_norm_ folded "
        "into it, more loader workers, the data in memory) and print each measured gain beside "
        "its estimate, with the loss drift (the script runs several times; its stdout is dropped)",
    )
    doc.add_argument(
        "--verify-rounds",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="with --verify: run every fix N times, each round between runs of the script as it "
        "is, and report the median over the rounds (default 1; more on a noisy machine)",
    )
    doc.add_argument("--no-trace", action="store_true", help="do not write trace.json")
    doc.add_argument("--no-png", action="store_true", help="do not write steps.png")
    doc.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py ARGS")
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "demo":  # its own parser (python -m torchspeed.demo is the same)
        from .demo import main as demo_main

        return demo_main(argv[1:])
    if argv and argv[0] == "doctor":
        # Everything after `--` (or after the options) is the script's: argparse must not read it.
        args = ap.parse_args(argv)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            doc.error("give the training command, e.g. torchspeed doctor -- python train.py")
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                doc.error("argument --device: cuda, but CUDA is not available")
        if args.stop_script and args.steps is None:
            doc.error("--stop-script needs --steps N")
        from .profile._doctor import check_command
        from .profile._doctor import run as run_doctor

        try:
            check_command(command)
        except (ValueError, OSError, ImportError) as e:
            doc.error(str(e).removeprefix("torchspeed doctor: "))
        if args.verify is not None:
            from .profile._doctor import run_verify

            return run_verify(
                command,
                steps=args.verify,
                warmup=args.warmup,
                file=sys.stderr,
                rounds=args.verify_rounds,
            )
        try:
            return run_doctor(
                command,
                steps=args.steps,
                warmup=args.warmup,
                out=args.out,
                device=args.device,
                trace=not args.no_trace,
                png=not args.no_png,
                then="stop" if args.stop_script else "continue",
                file=sys.stderr,
            )
        except Exception as e:  # noqa: BLE001 (the script's error: printed as python prints it)
            from .profile._doctor import print_script_error

            print_script_error(e)
            return 1
    args, extra = ap.parse_known_args(argv)
    if args.cmd == "info":
        from . import info

        return info.main(extra)
    if args.cmd == "bench" and args.name == "all":
        return benchmarks.run_all(args.args + extra)
    if args.cmd == "bench":
        return benchmarks.run(args.name, args.args + extra)
    from .demo import main as demo_main

    return demo_main(extra)


if __name__ == "__main__":
    raise SystemExit(main())
