"""torchspeed's loader from WebDataset shards, stopped mid-epoch and resumed exactly.

    python examples/python/loader_resume.py --out /tmp/shards       # 512 images, 2 epochs
    python examples/python/loader_resume.py --quick                 # 96 images (what CI runs)

1. Writes JPEG shards with torchspeed.data.write_shards.ShardWriter (a .tar.idx index per shard;
   `python -m torchspeed.data.write_shards IMAGE_FOLDER OUT` does the same from an ImageFolder).
2. Reads them with torchspeed.data.DataLoader(WebDataset(...)): decode, RandomResizedCrop, flip,
   normalize and collate run in C++ threads, seeded by (seed, epoch, sample index).
3. Stops after a few batches, saves `loader.state_dict()` (a few integers) as JSON, builds a new
   loader with a different num_workers, loads the state and checks that the rest of the epoch is
   bitwise what an uninterrupted run yields.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile

import numpy as np
import torch
from PIL import Image

from torchspeed.data import DataLoader, WebDataset
from torchspeed.data.write_shards import ShardWriter


def write_shards(out: str, n: int, per_shard: int) -> list:
    rng = np.random.default_rng(0)
    with ShardWriter(out, "shard", maxcount=per_shard) as w:
        for i in range(n):
            h, w_ = int(rng.integers(120, 200)), int(rng.integers(120, 200))
            img = rng.integers(0, 256, (h // 8, w_ // 8, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(img).resize((w_, h)).save(buf, "JPEG", quality=90)
            w.write(f"{i:06d}", {"jpg": buf.getvalue(), "cls": str(i % 10).encode()})
        return list(w.paths)


def make_loader(urls, workers: int) -> DataLoader:
    ds = WebDataset(
        urls,
        fields=("jpg", "cls"),
        crop="random_resized_crop",
        size=64,
        flip_prob=0.5,
        dtype=torch.float32,
        normalize=True,  # ImageNet mean/std, in the C++ threads
    )
    return DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers, seed=42, drop_last=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="shard folder (default: a temporary one)")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="96 images")
    args = ap.parse_args(argv)
    n = 96 if args.quick else args.images
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or os.path.join(tmp, "shards")
        urls = write_shards(out, n, per_shard=max(16, n // 4))
        print(f"wrote {n} images into {len(urls)} shards in {out}")

        epoch = 1
        full = make_loader(urls, workers=2)
        full.set_epoch(epoch)
        expected = [(x.clone(), y.clone()) for x, y in full]
        print(
            f"uninterrupted epoch {epoch}: {len(expected)} batches of {tuple(expected[0][0].shape)}"
        )

        first = make_loader(urls, workers=2)
        first.set_epoch(epoch)
        stop_after = len(expected) // 2
        for i, _ in enumerate(first):
            if i + 1 == stop_after:
                break
        state = first.state_dict()  # save it with the model's checkpoint
        path = os.path.join(tmp, "loader_state.json")
        with open(path, "w") as f:
            json.dump(state, f)
        first.shutdown()
        print(f"stopped after {stop_after} batches; state: {state}")

        resumed = make_loader(urls, workers=1)  # another worker count: the same batches
        with open(path) as f:
            resumed.load_state_dict(json.load(f))
        rest = list(resumed)
        assert len(rest) == len(expected) - stop_after, (len(rest), len(expected), stop_after)
        for (x, y), (ex, ey) in zip(rest, expected[stop_after:]):
            assert torch.equal(x, ex) and torch.equal(y, ey), "resumed batches differ"
        print(
            f"resumed: the remaining {len(rest)} batches are bitwise those of the uninterrupted run"
        )
        st = resumed.stats()
        print(f"loader stats: {st['samples_per_s']:.0f} samples/s, decode {st['decode_s']:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
