"""Loader benchmark: torchspeed.data vs torch DataLoader + PIL on an ImageNet-like JPEG set.

Workload: 2,048 textured 500x375 JPEGs at quality 90 (~2.5 bits/pixel, generated here, cached),
stored as WebDataset shards (torchspeed) and as an image folder (torch). Pipeline: decode ->
RandomResizedCrop(224) -> horizontal flip -> uint8 CHW, batch 256. Reports images/s (median of
timed epochs after a warm-up), the single-core ceiling of the same native decode+crop calls,
first-batch latency, resident memory, in-memory tensor batches vs torch's default collate, and
the decode_scaling modes side by side: speed and fidelity (mean abs diff vs the Pillow reference).

    torchspeed bench loader [--quick] [--workers 1 2] [--epochs 3] [--decode-scaling-only]

Prints the harness's table (torchspeed.benchmarks.harness) and writes its JSON,
bench_loader_cpu.json, in $TORCHSPEED_RESULTS_DIR, else in ./torchspeed_results (the generated
images are cached there too). Needs Pillow (pip install torchspeed[bench]).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
from PIL import Image

from .._native import native_module
from ..data import DataLoader, TensorSource, WebDataset
from ..data.pil_reference import pil_reference
from ..data.shard_writer import ShardWriter
from ..demo.baseline import RandomResizedCrop
from .harness import Harness, results_dir


# ------------------------------------------------------------------------------ data generation
def textured(w: int, h: int, seed: int, noise: float = 5.5) -> np.ndarray:
    """Sinusoid mixtures + grain: ~2.5 bpp at q90 (flat images would flatter the decoder)."""
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for _ in range(6):
        fx, fy = r.uniform(0.005, 0.12, 2)
        ph, amp, col = r.uniform(0, 6.3), r.uniform(10, 40), r.uniform(0.3, 1, 3)
        img += amp * np.sin(fx * x + fy * y + ph)[..., None] * col
    img += r.uniform(60, 180, 3)
    img += r.normal(0, noise, (h, w, 1)) + r.normal(0, noise / 2, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_dataset(root: str, n: int, per_shard: int = 256) -> dict:
    folder, shards = os.path.join(root, "folder"), os.path.join(root, "shards")
    stamp = os.path.join(root, f"done-{n}")
    if not os.path.exists(stamp):
        os.makedirs(folder, exist_ok=True)
        total = 0
        with ShardWriter(shards, "train", per_shard) as w:
            for i in range(n):
                buf = io.BytesIO()
                Image.fromarray(textured(500, 375, i)).save(buf, "JPEG", quality=90)
                data = buf.getvalue()
                total += len(data)
                label = i % 1000
                with open(os.path.join(folder, f"{i:06d}_{label}.jpg"), "wb") as f:
                    f.write(data)
                w.write(f"{i:06d}", {"jpg": data, "cls": str(label).encode()})
                if (i + 1) % 256 == 0:
                    sys.stderr.write(f"\rgenerating {i + 1}/{n}")
        sys.stderr.write("\n")
        with open(stamp, "w") as f:
            json.dump({"bpp": total * 8 / (n * 500 * 375)}, f)
    with open(stamp) as f:
        bpp = json.load(f)["bpp"]
    files = sorted(os.path.join(folder, x) for x in os.listdir(folder) if x.endswith(".jpg"))[:n]
    urls = sorted(os.path.join(shards, x) for x in os.listdir(shards) if x.endswith(".tar"))
    return {"files": files, "urls": urls, "bpp": bpp}


# ------------------------------------------------------------------------------ torch baseline
class FolderDataset(torch.utils.data.Dataset):
    def __init__(self, files):
        self.files = files
        self.rrc = RandomResizedCrop(224)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        img = Image.open(self.files[i]).convert("RGB")
        img = self.rrc(img)
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
        label = int(os.path.basename(self.files[i]).split("_")[1].split(".")[0])
        return x, label


# ------------------------------------------------------------------------------ measurement
def rss_mb(include_children: bool = False) -> float:
    def one(pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    total = one(os.getpid())
    if include_children:
        try:
            with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
                total += sum(one(int(p)) for p in f.read().split())
        except OSError:
            pass
    return total


def time_epochs(loader, epochs: int, n_images: int) -> dict:
    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    first_batch_s = time.perf_counter() - t0
    for _ in it:  # warm-up epoch (includes the first batch)
        pass
    del first
    rates = []
    for _ in range(epochs):
        t = time.perf_counter()
        count = 0
        for batch in loader:
            count += batch[0].shape[0]
        rates.append(count / (time.perf_counter() - t))
    return {
        "images_per_s": statistics.median(rates),
        "runs": rates,
        "first_batch_s": first_batch_s,
        "images_per_epoch": n_images,
    }


def bench_torch(files, workers: int, epochs: int, batch: int) -> dict:
    ds = FolderDataset(files)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=2,
        drop_last=False,
    )
    r = time_epochs(dl, epochs, len(files))
    r["rss_mb"] = rss_mb(include_children=True)
    del dl
    return r


def bench_ours(urls, workers: int, epochs: int, batch: int) -> dict:
    base = rss_mb()
    ds = WebDataset(
        urls, fields=("jpg", "cls"), crop="random_resized_crop", size=224, flip_prob=0.5
    )
    dl = DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        seed=0,
        persistent_workers=True,
        pin_memory=True,
    )
    r = time_epochs(dl, epochs, len(ds))
    r["rss_mb"] = rss_mb()
    r["rss_delta_mb"] = r["rss_mb"] - base
    r["slot_mb"] = dl.stats()["slots"] * batch * 3 * 224 * 224 / 2**20
    st = dl.stats()
    r["stats"] = {k: v for k, v in st.items() if k != "last_error"}
    dl.shutdown()
    return r


def bench_ceiling(urls, n: int) -> dict:
    """One thread, the same native calls (decode with scaling + RRC + flip), no loader around."""
    import tarfile

    D = native_module("data", "torchspeed bench loader")
    blobs = []
    for u in urls:
        with tarfile.open(u) as tf:
            blobs += [tf.extractfile(m).read() for m in tf.getmembers() if m.name.endswith(".jpg")]
    blobs = blobs[:n]
    o = D.ImageTransformOptions()
    o.crop, o.height, o.width, o.flip_prob = "random_resized_crop", 224, 224, 0.5
    for i, b in enumerate(blobs[:64]):
        D.process_image(b, o, 0, 0, i)
    t = time.perf_counter()
    for i, b in enumerate(blobs):
        D.process_image(b, o, 0, 1, i)
    per_s = len(blobs) / (time.perf_counter() - t)
    o.decode_scaling = False
    t = time.perf_counter()
    for i, b in enumerate(blobs[:512]):
        D.process_image(b, o, 0, 1, i)
    per_s_noscale = min(512, len(blobs)) / (time.perf_counter() - t)
    return {"images_per_s": per_s, "images_per_s_no_decode_scaling": per_s_noscale}


def bench_decode_scaling(urls, n: int, n_fidelity: int = 32) -> dict:
    """Speed (one core, native process_image) and fidelity (per-image mean |diff| vs the Pillow
    reference) of decode_scaling="accurate" (default), "fast" and "off", per crop mode."""
    import tarfile

    D = native_module("data", "torchspeed bench loader")
    blobs = []
    for u in urls:
        with tarfile.open(u) as tf:
            blobs += [tf.extractfile(m).read() for m in tf.getmembers() if m.name.endswith(".jpg")]
    blobs = blobs[:n]
    rows = []
    for crop, size, resize_size in (
        ("random_resized_crop", 224, 256),
        ("random_resized_crop", 112, 128),
        ("resize_center_crop", 224, 256),
        ("resize_center_crop", 112, 128),
        ("resize", 112, 128),
        ("resize", 64, 64),
    ):
        row = {"crop": crop, "size": size, "modes": {}}
        for mode in ("accurate", "fast", "off"):
            o = D.ImageTransformOptions()
            o.crop, o.height, o.width, o.resize_size = crop, size, size, resize_size
            o.decode_scaling = mode
            for i, b in enumerate(blobs[:16]):
                D.process_image(b, o, 0, 0, i)
            t = time.perf_counter()
            for i, b in enumerate(blobs):
                D.process_image(b, o, 0, 1, i)
            per_s = len(blobs) / (time.perf_counter() - t)
            diffs, scaled = [], 0
            for i, b in enumerate(blobs[:n_fidelity]):
                w, h = Image.open(io.BytesIO(b)).size
                d = D.draw_image_params(o, w, h, True, 0, 1, i)
                scaled += d["scale_denom"] > 1
                out = D.process_image(b, o, 0, 1, i).numpy().astype(np.int16)
                diffs.append(
                    float(
                        np.abs(
                            out - pil_reference(b, o, d).transpose(2, 0, 1).astype(np.int16)
                        ).mean()
                    )
                )
            row["modes"][mode] = {
                "images_per_s": per_s,
                "mean_abs_diff": statistics.mean(diffs),
                "max_image_mean_abs_diff": max(diffs),
                "scaled_fraction": scaled / len(diffs),
            }
        rows.append(row)
    return {"images": len(blobs), "fidelity_images": n_fidelity, "rows": rows}


def print_decode_scaling(r: dict) -> None:
    print(
        f"\ndecode_scaling on one core ({r['images']} images; fidelity = per-image mean |diff| "
        f"vs full decode + PIL BILINEAR, mean / worst of {r['fidelity_images']})"
    )
    hdr = f"{'crop':>19} {'size':>4} | " + " | ".join(
        f"{m + ' img/s':>14} {'diff':>11}" for m in ("accurate", "fast", "off")
    )
    print(hdr)
    print("-" * len(hdr))
    for row in r["rows"]:
        cells = []
        for m in ("accurate", "fast", "off"):
            x = row["modes"][m]
            cells.append(
                f"{x['images_per_s']:>14,.0f} {x['mean_abs_diff']:>5.2f}/{x['max_image_mean_abs_diff']:<5.2f}"
            )
        print(f"{row['crop']:>19} {row['size']:>4} | " + " | ".join(cells))


def bench_tensors(batch: int, epochs: int) -> dict:
    n = 50_000
    x = torch.randint(0, 255, (n, 3, 32, 32), dtype=torch.uint8)
    y = torch.randint(0, 10, (n,))
    out = {}
    for name, make in (
        (
            "torch_default_collate",
            lambda: torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(x, y), batch_size=batch, shuffle=True
            ),
        ),
        (
            "torchspeed_tensor_source_1t",
            lambda: DataLoader(
                TensorSource(x, y),
                batch_size=batch,
                shuffle=True,
                seed=0,
                num_workers=1,
                persistent_workers=True,
            ),
        ),
    ):
        dl = make()
        for _ in dl:
            pass
        rates = []
        for _ in range(epochs):
            t = time.perf_counter()
            for _ in dl:
                pass
            rates.append(n / (time.perf_counter() - t))
        out[name] = {"samples_per_s": statistics.median(rates), "runs": rates}
    out["speedup"] = (
        out["torchspeed_tensor_source_1t"]["samples_per_s"]
        / out["torch_default_collate"]["samples_per_s"]
    )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="torchspeed bench loader", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--images", type=int, default=2048)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--epochs", type=int, default=3, help="timed epochs after one warm-up")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--quick", action="store_true", help="512 images, 1 timed epoch (CI smoke)")
    p.add_argument("--data-dir", default=None, help="where the generated images are cached")
    p.add_argument(
        "--decode-scaling-only",
        action="store_true",
        help="only the decode_scaling speed/fidelity table (no loader runs)",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.images, a.epochs = 512, 1
    out_dir = results_dir()
    data_dir = a.data_dir or os.path.join(out_dir, "loader_data")
    data = make_dataset(data_dir, a.images)
    torch.set_num_threads(1)
    if a.decode_scaling_only:
        r = bench_decode_scaling(data["urls"], min(a.images, 512))
        print_decode_scaling(r)
        path = os.path.join(out_dir, "bench_loader_decode_scaling.json")
        with open(path, "w") as f:
            json.dump(r, f, indent=2)
        print(f"wrote {path}")
        return 0

    h = Harness(
        "bench_loader", "torchspeed bench loader " + " ".join(argv or []), measure_bandwidth=False
    )
    h.details["workload"] = {
        "images": a.images,
        "size": "500x375",
        "quality": 90,
        "bits_per_pixel": data["bpp"],
        "batch": a.batch,
        "pipeline": "decode -> RandomResizedCrop(224) -> flip -> uint8 CHW",
        "timed_epochs": a.epochs,
    }
    h.details["ceiling_1core"] = bench_ceiling(data["urls"], a.images)
    ceiling = h.details["ceiling_1core"]["images_per_s"]
    print(
        f"Loader benchmark: {a.images} JPEGs 500x375 q90 ({data['bpp']:.2f} bpp), batch "
        f"{a.batch}, RRC(224)+flip, uint8 CHW; {os.cpu_count()} CPUs"
    )
    print(
        f"single-core ceiling (native decode+crop, no loader): {ceiling:,.0f} img/s "
        f"({h.details['ceiling_1core']['images_per_s_no_decode_scaling']:,.0f} without "
        "decode-time scaling)"
    )
    for n in a.workers:
        t = bench_torch(data["files"], n, a.epochs, a.batch)
        o = bench_ours(data["urls"], n, a.epochs, a.batch)
        group = f"JPEG RRC(224), {n} worker(s)"
        h.record(group, "torch DataLoader + PIL", t["images_per_s"], "img/s", anchor=True, **t)
        h.record(
            group,
            "torchspeed DataLoader",
            o["images_per_s"],
            "img/s",
            efficiency_vs_n_x_ceiling=o["images_per_s"] / (n * ceiling),
            **o,
        )
        print(
            f"{n} worker(s): first batch torch {t['first_batch_s']:.2f} s, ours "
            f"{o['first_batch_s']:.2f} s; RSS torch {t['rss_mb']:,.0f} MB, ours "
            f"{o['rss_mb']:,.0f} MB; ours/(N*ceiling) {o['images_per_s'] / (n * ceiling):.0%}"
        )
    tb = bench_tensors(a.batch, max(a.epochs, 2))
    group = f"tensors 3x32x32, batch {a.batch}"
    h.record(
        group,
        "torch default collate",
        tb["torch_default_collate"]["samples_per_s"],
        "samples/s",
        anchor=True,
    )
    h.record(
        group,
        "torchspeed TensorSource, 1 thread",
        tb["torchspeed_tensor_source_1t"]["samples_per_s"],
        "samples/s",
    )
    h.details["tensor_batches"] = tb
    h.details["decode_scaling"] = bench_decode_scaling(data["urls"], min(a.images, 512))
    print_decode_scaling(h.details["decode_scaling"])
    print()
    h.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
