"""Write WebDataset tar shards from an image folder, a list of images or .npy arrays.

Examples (each line runs as written; tests/python/data/test_write_shards.py runs them all):

    python -m torchspeed.data.write_shards train/ shards/ --maxcount 1000 --shuffle 0
    python -m torchspeed.data.write_shards train/ -o shards/ --on-error skip
    python -m torchspeed.data.write_shards --arrays x.npy y.npy --names x y shards/
    python -m torchspeed.data.write_shards --arrays x.npy y.npy --names x y -o shards/ --overwrite

Image folders follow torchvision's ImageFolder: each subfolder is a class, its index is the
position of the folder name in sorted order, and its images are found recursively in sorted order
(extensions .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, in any case). Each sample gets
<key>.jpg or <key>.png and <key>.cls; the class names go to OUT_DIR/classes.txt. A folder without
subfolders gives images only. Every image is decoded once with the loader's own decoder: JPEG and
PNG bytes that decode are stored unchanged, under the extension of their content. Other formats,
and JPEG/PNG files the loader cannot decode but Pillow can (a CMYK JPEG, say), are converted with
Pillow: a JPEG to JPEG quality 95, anything else to lossless PNG. A file that cannot be read or decoded stops the run
naming the file (--on-error raise, the default) or is left out and counted (--on-error skip).

Arrays: sample i gets <key>.<name>.npy holding row i of each array with the row's exact dtype and
shape (rows of a 1-D array are 0-d, so a labels array loads as [B], as with NpySource).

Output: OUT_DIR/PREFIX-000000.tar, PREFIX-000001.tar, ... each with a .tar.idx index. OUT_DIR
must be empty or missing; --overwrite first removes the PREFIX-NNNNNN.tar and .tar.idx files of
an earlier run (and nothing else). Shards are written into a hidden folder inside OUT_DIR and
moved into place at the end, so a failed or interrupted run leaves OUT_DIR as it was.

Exit status: 0 done, 1 bad input data (the message names the file), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Iterable, List, Optional, Tuple

from .arrays import _write_arrays, write_arrays
from .image_folder import (
    IMG_EXTENSIONS,
    _write_image_folder,
    find_images,
    write_image_folder,
    write_images,
)
from .shard_writer import (
    _WHO,
    BadSampleError,
    ShardWriter,
    UsageError,
    WriteReport,
    WriteShardsError,
)

# The Python API, importable from here as documented (torchspeed.data.write_shards.ShardWriter).
__all__ = [
    "BadSampleError",
    "IMG_EXTENSIONS",
    "ShardWriter",
    "UsageError",
    "WriteReport",
    "WriteShardsError",
    "find_images",
    "main",
    "write_arrays",
    "write_image_folder",
    "write_images",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2, no usage dump
        sys.stderr.write(f"{_WHO}: {message} (see --help)\n")
        sys.exit(2)


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}")
    return v


def _build_parser() -> _Parser:
    doc = __doc__ or ""
    first, _, rest = doc.partition("\n\n")
    p = _Parser(
        prog="python -m torchspeed.data.write_shards",
        description=first,
        epilog=rest,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("inputs", nargs="*", metavar="PATH", help="IMAGE_DIR [OUT_DIR], or OUT_DIR")
    p.add_argument("-o", "--output", metavar="OUT_DIR", help="output folder (or give it last)")
    p.add_argument("--arrays", nargs="+", metavar="NPY", help=".npy files (axis 0 = samples)")
    p.add_argument("--names", nargs="+", metavar="NAME", help="field names (default: file stems)")
    p.add_argument("--maxcount", type=_positive_int, default=1000, help="samples per shard")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default 'shard')")
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED", help="shuffle samples")
    p.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="an image that cannot be read or decoded: stop naming it (default), or skip it",
    )
    p.add_argument("--overwrite", action="store_true", help="replace shards already in OUT_DIR")
    p.add_argument("--no-verify", action="store_true", help="only sniff image formats, no decode")
    p.add_argument("--no-index", action="store_true", help="do not write .tar.idx files")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _take_swallowed_output(a: argparse.Namespace) -> Optional[str]:
    """argparse gives every value after --arrays/--names to that option, so in the documented
    '--arrays x.npy y.npy --names x y OUT_DIR' (or '--arrays x.npy OUT_DIR --maxcount 9') OUT_DIR
    lands in one of those lists. When no OUT_DIR was found otherwise, it is the last value of the
    list that has one value too many (names must pair up with arrays). Returns that list's name."""
    if a.output is not None or a.inputs:
        return None
    if a.names is not None and len(a.names) == len(a.arrays) + 1:
        a.output = a.names.pop()
        return "names"
    if a.arrays and (a.names is None or len(a.arrays) == len(a.names) + 1):
        a.output = a.arrays.pop()
        return "arrays"
    return None


def _resolve(p: _Parser, argv: List[str]) -> Tuple[argparse.Namespace, str]:
    a = p.parse_intermixed_args(argv)  # IMAGE_DIR --maxcount 9 OUT_DIR works too
    if a.arrays is not None:
        taken = _take_swallowed_output(a)
        if taken == "arrays" and a.output.endswith(".npy"):
            p.error(f"OUT_DIR is missing ('{a.output}' looks like an input array)")
        if not a.arrays:
            p.error("--arrays needs at least one .npy file (and OUT_DIR last or with -o)")
        if a.names is not None and len(a.names) != len(a.arrays):
            p.error(
                f"--names gives {len(a.names)} name(s) for {len(a.arrays)} array(s) "
                "(OUT_DIR goes last or with -o)"
            )
        if a.output is not None and a.inputs:
            p.error("with --arrays, give OUT_DIR once (positional or -o), not both")
        if len(a.inputs) > 1:
            p.error(f"with --arrays, give only OUT_DIR, got {len(a.inputs)} paths")
        out = a.output if a.output is not None else (a.inputs[0] if a.inputs else None)
        if out is None:
            hint = "; --names takes one name per array" if a.names is not None else ""
            p.error(f"OUT_DIR is missing (give it last or with -o{hint})")
        if a.on_error != "raise" or a.no_verify:
            p.error("--on-error and --no-verify apply to images, not to --arrays")
        return a, out
    if a.names is not None:
        p.error("--names needs --arrays")
    if not a.inputs:
        p.error("give IMAGE_DIR and OUT_DIR (or --arrays ... OUT_DIR)")
    if a.output is not None:
        if len(a.inputs) != 1:
            p.error(f"with -o, give only IMAGE_DIR, got {len(a.inputs)} paths")
        return a, a.output
    if len(a.inputs) != 2:
        p.error(f"give IMAGE_DIR and OUT_DIR, got {len(a.inputs)} path(s)")
    return a, a.inputs[1]


def _print_report(r: WriteReport, out_dir: str) -> None:
    msg = f"wrote {r.written} sample(s) in {len(r.paths)} shard(s) to '{out_dir}'"
    if r.converted:
        msg += f" ({r.converted} image(s) converted with Pillow)"
    print(msg)
    for n in r.notes:
        sys.stderr.write(f"{_WHO}: note: {n}\n")
    if r.unchecked:
        sys.stderr.write(
            f"{_WHO}: note: {r.unchecked} image(s) were only format-checked "
            "(no decoder for them here: build torchspeed with JPEG support or install Pillow)\n"
        )
    if r.skipped:
        first = r.skipped[0][1].removeprefix(_WHO + ": ")
        sys.stderr.write(
            f"{_WHO}: skipped {len(r.skipped)} image(s) that cannot be read (--on-error skip); "
            f"first: {first}\n"
        )


def main(argv: Optional[Iterable[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _build_parser()
    a, out = _resolve(p, argv)
    common = dict(progress=not a.quiet, write_index=not a.no_index)
    try:
        if a.arrays is not None:
            r = _write_arrays(
                a.arrays,
                a.names,
                out,
                a.maxcount,
                a.prefix,
                shuffle_seed=a.shuffle,
                overwrite=a.overwrite,
                **common,
            )
        else:
            r = _write_image_folder(
                a.inputs[0],
                out,
                a.maxcount,
                a.prefix,
                a.shuffle,
                on_error=a.on_error,
                overwrite=a.overwrite,
                verify=not a.no_verify,
                **common,
            )
    except WriteShardsError as e:
        sys.stderr.write(f"{e}\n")
        return e.exit_code
    except OSError as e:  # the output cannot be written: disk full, permissions, ...
        where = f" '{e.filename}'" if e.filename else ""
        sys.stderr.write(f"{_WHO}: cannot write{where}: {e.strerror or e}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"{_WHO}: interrupted; '{out}' is unchanged\n")
        return 130
    _print_report(r, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
