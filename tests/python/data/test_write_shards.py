"""Tests for python -m torchspeed.data.write_shards: documented command lines, errors, overwrite,
image validation, ImageFolder class mapping and exact array round trips through the loader."""

import io
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import torchspeed
from torchspeed.data import DataLoader, NpySource, WebDataset
from torchspeed.data import write_shards as ws

sys.path.insert(0, os.path.dirname(__file__))
from data_helpers import D, Image, jpeg_bytes, needs_jpeg, png_bytes, textured  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CMD = "python -m torchspeed.data.write_shards"


def run_cli(args, cwd):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-m", "torchspeed.data.write_shards", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )


def assert_one_line_error(r, code, *needles):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("torchspeed.data.write_shards: "), err
    for n in needles:
        assert n in err, (n, err)


def make_image_folder(root, per_class=3, classes=("cat", "dog")):
    """ImageFolder layout: JPEG and PNG files; returns [(relative path, class index)]."""
    expected = []
    for ci, c in enumerate(classes):
        os.makedirs(os.path.join(root, c), exist_ok=True)
        for i in range(per_class):
            arr = textured(32 + i, 24, seed=ci * 100 + i)
            name = f"{i}.png" if i % 2 else f"{i}.jpg"
            path = os.path.join(root, c, name)
            with open(path, "wb") as f:
                f.write(png_bytes(Image.fromarray(arr)) if i % 2 else jpeg_bytes(arr))
            expected.append((os.path.join(c, name), ci))
    return expected


def read_tar_samples(out_dir, prefix="shard"):
    """[(key, {ext: bytes})] over the shards in order, read with tarfile (not with the loader)."""
    samples = []
    pat = re.compile(re.escape(prefix) + r"-\d{6}\.tar")
    for name in sorted(n for n in os.listdir(out_dir) if pat.fullmatch(n)):
        with tarfile.open(os.path.join(out_dir, name)) as tf:
            for m in tf.getmembers():
                base = os.path.basename(m.name)
                key, ext = base.split(".", 1)
                data = tf.extractfile(m).read()
                if samples and samples[-1][0] == key:
                    samples[-1][1][ext] = data
                else:
                    samples.append((key, {ext: data}))
    return samples


# ---- the documented command lines, verbatim -------------------------------------------------------
def documented_lines():
    sources = {
        "write_shards.py docstring": ws.__doc__,
        "README.md": open(os.path.join(REPO, "README.md"), encoding="utf-8").read(),
    }
    lines = []
    for where, text in sources.items():
        found = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(CMD)]
        assert found, f"no '{CMD}' example in {where}"
        lines += [(where, ln) for ln in found]
    return lines


def readme_loader_snippet():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("### Writing shards") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def make_doc_inputs(cwd):
    make_image_folder(os.path.join(cwd, "train"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3)).astype(np.float32)
    y = rng.integers(0, 10, 7)
    np.save(os.path.join(cwd, "x.npy"), x)
    np.save(os.path.join(cwd, "y.npy"), y)
    return x, y


@needs_jpeg
@pytest.mark.parametrize("where,line", documented_lines())
def test_documented_example_runs_verbatim(tmp_path, monkeypatch, where, line):
    x, y = make_doc_inputs(str(tmp_path))
    argv = shlex.split(line)
    assert argv[:3] == ["python", "-m", "torchspeed.data.write_shards"], line
    if "--overwrite" in argv:  # give --overwrite something to replace
        os.makedirs(tmp_path / "shards")
        (tmp_path / "shards" / "shard-000007.tar").write_bytes(b"stale")
    r = run_cli(argv[3:], cwd=str(tmp_path))
    assert r.returncode == 0, (where, line, r.stderr)
    assert "Traceback" not in r.stderr
    shards = str(tmp_path / "shards" / "shard-*.tar")
    if "--arrays" in argv:
        # The loader snippet documented in README.md, run as written on the shards just written.
        monkeypatch.chdir(tmp_path)
        ns = {"torchspeed": torchspeed}
        exec(readme_loader_snippet(), ns)
        ((gx, gy),) = list(ns["loader"])
        assert gx.dtype == torch.float32 and gy.dtype == torch.int64 and gy.shape == (7,)
        torch.testing.assert_close(gx, torch.from_numpy(x), rtol=0, atol=0)
        torch.testing.assert_close(gy, torch.from_numpy(y), rtol=0, atol=0)
    else:
        ds = WebDataset(shards, fields=("jpg;png", "cls"), crop="resize", size=8)
        ((imgs, labels),) = list(DataLoader(ds, batch_size=6))
        assert imgs.shape == (6, 3, 8, 8) and sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1]
    assert not (tmp_path / "shards" / "shard-000007.tar").exists()


def test_arrays_documented_form_keeps_out_dir_out_of_names(tmp_path):
    """'--arrays x.npy y.npy --names x y OUT_DIR' used to fail: argparse put OUT_DIR in --names."""
    make_doc_inputs(str(tmp_path))
    r = run_cli(["--arrays", "x.npy", "y.npy", "--names", "x", "y", "out"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["shard-000000.tar", "shard-000000.tar.idx"]
    ((key, fields),) = read_tar_samples(str(tmp_path / "out"))[:1]
    assert sorted(fields) == ["x.npy", "y.npy"]


@pytest.mark.parametrize(
    "args",
    [
        ["--arrays", "x.npy", "y.npy", "--names", "x", "y", "out"],
        ["--arrays", "x.npy", "y.npy", "out"],
        ["--arrays", "x.npy", "y.npy", "--names", "x", "y", "-o", "out"],
        ["-o", "out", "--arrays", "x.npy", "y.npy"],
        ["out", "--arrays", "x.npy", "y.npy", "--names", "x", "y"],
        ["--names", "x", "y", "--arrays", "x.npy", "y.npy", "out"],
        ["--arrays", "x.npy", "y.npy", "--maxcount", "3", "out"],
        ["--arrays", "x.npy", "y.npy", "out", "--maxcount", "3"],
        ["--arrays", "x.npy", "y.npy", "out", "--names", "x", "y"],
        ["--arrays", "x.npy", "y.npy", "--names", "x", "y", "out", "--maxcount", "3"],
    ],
)
def test_arrays_out_dir_forms(tmp_path, monkeypatch, args):
    make_doc_inputs(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert ws.main(args + ["--quiet"]) == 0
    n_shards = 3 if "--maxcount" in args else 1
    assert len([n for n in os.listdir("out") if n.endswith(".tar")]) == n_shards
    assert [sorted(f) for _, f in read_tar_samples("out")] == [["x.npy", "y.npy"]] * 7


@needs_jpeg
def test_image_out_dir_forms(tmp_path, monkeypatch):
    make_image_folder(str(tmp_path / "train"))
    monkeypatch.chdir(tmp_path)
    assert ws.main(["train", "a", "--quiet"]) == 0
    assert ws.main(["train", "-o", "b", "--quiet"]) == 0
    assert ws.main(["-o", "c", "train", "--quiet"]) == 0
    assert ws.main(["train", "--maxcount", "1000", "d", "--quiet"]) == 0
    samples = read_tar_samples("a")
    assert len(samples) == 6
    assert samples == read_tar_samples("b") == read_tar_samples("c") == read_tar_samples("d")


# ---- usage errors (exit 2) and bad data (exit 1): one line, naming the file, nothing written --------
USAGE_CASES = [
    (["missing_dir", "out"], "missing_dir"),
    (["--arrays", "x.npy", "nope.npy", "out"], "nope.npy"),
    (["--arrays", "x.npy", "y.npy"], "OUT_DIR is missing"),
    (["--arrays", "x.npy", "y.npy", "--names", "x", "y"], "OUT_DIR"),
    (["--arrays", "x.npy", "y.npy", "--names", "x", "out"], "OUT_DIR is missing"),
    (
        ["--arrays", "x.npy", "y.npy", "--names", "x", "y", "z", "w", "out"],
        "5 name(s) for 2 array(s)",
    ),
    (["--arrays", "x.npy", "x.npy", "out"], "'x' is given twice"),
    (["--arrays", "x.npy", "--names", "a/b", "out"], "'a/b'"),
    (["train", "out", "--names", "x"], "--names needs --arrays"),
    (["train"], "give IMAGE_DIR and OUT_DIR"),
    (["train", "out", "extra"], "got 3 path(s)"),
    (["train", "out", "--maxcount", "0"], "--maxcount"),
    (["train", "out", "--frobnicate"], "--frobnicate"),
    (["train", "out", "--on-error", "ignore"], "--on-error"),
    (["train", "train/cat/sub"], "inside the image folder"),
    (["train", "a_file"], "'a_file' exists and is not a folder"),
    (["train", "full"], "'full' is not empty"),
    (["--arrays", "x.npy", "full"], "'full' is not empty"),
    (["--arrays", "x.npy", "out", "--on-error", "skip"], "apply to images"),
    (["train", "out", "--prefix", "a/b"], "prefix"),
    (["empty_dir", "out"], "no images under 'empty_dir'"),
]


@pytest.mark.parametrize("args,needle", USAGE_CASES)
def test_usage_errors_exit_2_one_line(tmp_path, args, needle):
    make_doc_inputs(str(tmp_path))
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("keep me")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    r = run_cli(args, cwd=str(tmp_path))
    assert_one_line_error(r, 2, needle)
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert after == before, "a usage error must not write anything"


def _garbage_jpg(path):
    with open(path, "wb") as f:
        f.write(b"this is not a jpeg at all, just text saved as .jpg\n" * 4)


def _truncated_jpg(path):
    with open(path, "wb") as f:
        f.write(jpeg_bytes(textured(64, 48, seed=1))[:400])


def _truncated_png(path):
    with open(path, "wb") as f:
        f.write(png_bytes(Image.fromarray(textured(64, 48, seed=2)))[:300])


def _empty_jpg(path):
    open(path, "wb").close()


def _dangling_link(path):
    os.symlink(os.path.join(os.path.dirname(path), "gone.jpg"), path)


@needs_jpeg
@pytest.mark.parametrize(
    "make_bad,needle",
    [
        (_garbage_jpg, "is not a JPEG or PNG"),
        (_truncated_jpg, "cannot decode"),
        (_truncated_png, "cannot decode"),
        (_empty_jpg, "is empty"),
        (_dangling_link, "cannot read"),
    ],
)
def test_bad_image_exit_1_names_file_and_writes_nothing(tmp_path, make_bad, needle):
    make_image_folder(str(tmp_path / "train"))
    bad = tmp_path / "train" / "dog" / "bad.jpg"
    make_bad(str(bad))
    r = run_cli(["train", "out"], cwd=str(tmp_path))
    assert_one_line_error(r, 1, needle, os.path.join("train", "dog", "bad.jpg"))
    assert not (tmp_path / "out").exists(), "a failed run must leave no output folder"


def test_unreadable_image_names_file(tmp_path, monkeypatch):
    """A read error (permissions; root can read anything, so it is injected) names the file."""
    make_image_folder(str(tmp_path / "train"))
    real_open = open
    bad = str(tmp_path / "train" / "cat" / "1.png")

    def guarded_open(path, *a, **k):
        if os.fspath(path) == bad:
            raise PermissionError(13, "Permission denied", bad)
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", guarded_open)
    with pytest.raises(ws.BadSampleError, match=re.escape(f"cannot read '{bad}': Permission")):
        ws.write_image_folder(str(tmp_path / "train"), str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()


def _npy_garbage(path):
    with open(path, "wb") as f:
        f.write(b"not numpy")


def _npy_truncated(path):
    buf = io.BytesIO()
    np.save(buf, np.arange(100, dtype=np.float32))
    with open(path, "wb") as f:
        f.write(buf.getvalue()[:-40])


@pytest.mark.parametrize(
    "make_bad,needle",
    [
        (lambda p: np.save(p, np.zeros(4, np.complex64)), "dtype complex64"),
        (lambda p: np.save(p, np.zeros(4, np.uint32)), "dtype uint32"),
        (lambda p: np.save(p, np.array([{}, 1], dtype=object)), "is not a readable .npy"),
        (lambda p: np.save(p, np.float32(3)), "is 0-d"),
        (lambda p: np.save(p, np.zeros((0, 3), np.float32)), "has 0 rows, expected 7"),
        (lambda p: np.save(p, np.zeros(6, np.float32)), "has 6 rows, expected 7"),
        (_npy_garbage, "is not a readable .npy"),
        (_npy_truncated, "is not a readable .npy"),
    ],
)
def test_bad_array_exit_1_names_file(tmp_path, make_bad, needle):
    make_doc_inputs(str(tmp_path))
    make_bad(str(tmp_path / "bad.npy"))
    r = run_cli(["--arrays", "x.npy", "bad.npy", "out"], cwd=str(tmp_path))
    assert_one_line_error(r, 1, needle, "bad.npy")
    assert not (tmp_path / "out").exists()


# ---- image validation while writing ---------------------------------------------------------------
@needs_jpeg
def test_on_error_skip_counts_and_keeps_labels(tmp_path):
    expected = make_image_folder(str(tmp_path / "train"), per_class=4)
    _garbage_jpg(str(tmp_path / "train" / "cat" / "0a.jpg"))
    _truncated_jpg(str(tmp_path / "train" / "dog" / "9.jpg"))
    r = run_cli(["train", "out", "--on-error", "skip"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "skipped 2 image(s)" in r.stderr and "0a.jpg" in r.stderr
    samples = read_tar_samples(str(tmp_path / "out"))
    assert [int(f["cls"]) for _, f in samples] == [c for _, c in expected]
    assert [k for k, _ in samples] == [f"{i:08d}" for i in range(len(expected))]
    for (_, f), (rel, _) in zip(samples, expected):
        src = (tmp_path / "train" / rel).read_bytes()
        ext = "png" if rel.endswith(".png") else "jpg"
        assert f[ext] == src, "valid JPEG/PNG bytes are stored unchanged"


@needs_jpeg
def test_all_images_bad_with_skip_is_an_error(tmp_path):
    os.makedirs(tmp_path / "train" / "a")
    _garbage_jpg(str(tmp_path / "train" / "a" / "x.jpg"))
    r = run_cli(["train", "out", "--on-error", "skip"], cwd=str(tmp_path))
    assert_one_line_error(r, 1, "none of the 1 image(s)", "x.jpg")
    assert not (tmp_path / "out").exists()


@needs_jpeg
def test_content_decides_extension_and_conversions_decode_like_pillow(tmp_path):
    root = tmp_path / "flat"
    root.mkdir()
    arr = textured(40, 30, seed=5)
    (root / "a_png_named.jpg").write_bytes(png_bytes(Image.fromarray(arr)))
    Image.fromarray(arr).save(root / "b.bmp")
    cmyk = io.BytesIO()
    Image.fromarray(arr).convert("CMYK").save(cmyk, "JPEG", quality=95)
    (root / "c_cmyk.jpg").write_bytes(cmyk.getvalue())
    (root / "d.JPEG").write_bytes(jpeg_bytes(arr))
    (root / "e.gif").write_bytes(b"GIF89a")  # not an ImageFolder extension: left out
    (root / "notes.txt").write_text("not an image")
    out = str(tmp_path / "out")
    paths = ws.write_image_folder(str(root), out, progress=False)
    assert paths == [os.path.join(out, "shard-000000.tar")]
    samples = read_tar_samples(out)
    assert [sorted(f) for _, f in samples] == [["png"], ["png"], ["jpg"], ["jpg"]]
    assert not os.path.exists(os.path.join(out, "classes.txt"))
    assert samples[0][1]["png"] == (root / "a_png_named.jpg").read_bytes()
    assert samples[3][1]["jpg"] == (root / "d.JPEG").read_bytes()

    # Converted ones: the loader decodes what Pillow decodes from the source file; exactly for a
    # lossless source (stored as PNG), within one JPEG q95 4:4:4 re-encode for a CMYK JPEG
    # (measured mean |diff| 3.3 on this noisy texture).
    def decoded(data):
        return D.decode_image(data).to(torch.int32)

    def pil_rgb(path):
        return torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).astype(np.int32))

    torch.testing.assert_close(
        decoded(samples[1][1]["png"]), pil_rgb(root / "b.bmp"), rtol=0, atol=0
    )
    got, ref = decoded(samples[2][1]["jpg"]), pil_rgb(root / "c_cmyk.jpg")
    assert got.shape == ref.shape
    assert float((got - ref).abs().float().mean()) < 4.0


@needs_jpeg
def test_no_verify_only_sniffs(tmp_path):
    make_image_folder(str(tmp_path / "train"), per_class=2)
    _truncated_jpg(str(tmp_path / "train" / "cat" / "t.jpg"))
    r = run_cli(["train", "out", "--no-verify"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert len(read_tar_samples(str(tmp_path / "out"))) == 5


def test_progress_bar_is_tqdm(tmp_path, monkeypatch):
    import tqdm

    seen = {}

    class Recorder:
        def __init__(self, total, **kw):
            seen["total"], seen["n"], seen["closed"] = total, 0, False

        def update(self, n=1):
            seen["n"] += n

        def set_postfix_str(self, s):
            pass

        def close(self):
            seen["closed"] = True

    monkeypatch.setattr(tqdm, "tqdm", Recorder)
    np.save(tmp_path / "a.npy", np.arange(9))
    ws.write_arrays([str(tmp_path / "a.npy")], None, str(tmp_path / "out"), maxcount=4)
    assert seen == {"total": 9, "n": 9, "closed": True}


def test_tqdm_is_a_declared_dependency():
    reqs = open(os.path.join(REPO, "requirements.txt")).read().split()
    assert "tqdm" in reqs
    setup = open(os.path.join(REPO, "setup.py")).read()
    assert re.search(r"install_requires=.*\"tqdm\"", setup)


# ---- output folder: refuse non-empty, --overwrite removes only our own shards -------------------
def test_overwrite_removes_only_own_shards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save("a.npy", np.arange(10))
    assert ws.main(["--arrays", "a.npy", "out", "--maxcount", "3", "--quiet"]) == 0
    assert len([n for n in os.listdir("out") if n.endswith(".tar")]) == 4
    keep = [
        "notes.txt",
        "other-000000.tar",
        "myshard-000001.tar",
        "shard-000000.tar.bak",
        "shard-1.tar",
        "shard-000001.tar.idx.old",
        "shard-abcdef.tar",
    ]
    for k in keep:
        with open(os.path.join("out", k), "w") as f:
            f.write("user data")
    os.makedirs("out/shard-000009.tar")  # a folder with a shard's name is not ours
    r = ws.main(["--arrays", "a.npy", "out", "--quiet"])
    assert r == 2, "a non-empty folder needs --overwrite"
    assert ws.main(["--arrays", "a.npy", "out", "--overwrite", "--quiet"]) == 0
    names = sorted(os.listdir("out"))
    assert names == sorted(keep + ["shard-000000.tar", "shard-000000.tar.idx", "shard-000009.tar"])
    for k in keep:
        assert open(os.path.join("out", k)).read() == "user data"
    dl = DataLoader(WebDataset("out/shard-000000.tar", fields="a.npy"), batch_size=100)
    assert [b.tolist() for b in dl] == [list(range(10))]


@needs_jpeg
def test_failed_overwrite_leaves_old_shards(tmp_path):
    make_image_folder(str(tmp_path / "train"))
    assert run_cli(["train", "out"], cwd=str(tmp_path)).returncode == 0
    before = {n: (tmp_path / "out" / n).read_bytes() for n in os.listdir(tmp_path / "out")}
    _garbage_jpg(str(tmp_path / "train" / "dog" / "z.jpg"))
    r = run_cli(["train", "out", "--overwrite"], cwd=str(tmp_path))
    assert_one_line_error(r, 1, "z.jpg")
    after = {n: (tmp_path / "out" / n).read_bytes() for n in os.listdir(tmp_path / "out")}
    assert after == before


def test_interrupted_run_leaves_folder_unchanged(tmp_path, monkeypatch):
    np.save(tmp_path / "a.npy", np.arange(10))
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-000000.tar").write_bytes(b"old")
    calls = {"n": 0}
    real = ws.ShardWriter.write

    def interrupting(self, key, fields):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(self, key, fields)

    monkeypatch.setattr(ws.ShardWriter, "write", interrupting)
    with pytest.raises(KeyboardInterrupt):
        ws.write_arrays([str(tmp_path / "a.npy")], None, str(out), maxcount=2, overwrite=True)
    assert sorted(os.listdir(out)) == ["shard-000000.tar"]
    assert (out / "shard-000000.tar").read_bytes() == b"old"


# ---- ImageFolder class mapping and image lists --------------------------------------------------
@needs_jpeg
def test_image_folder_classes_match_torchvision_rule(tmp_path):
    """torchvision's ImageFolder: classes = sorted subfolder names (os.scandir, is_dir), index =
    position; files: sorted(os.walk(class, followlinks=True)), sorted names, known extensions in
    any case; files at the top level are ignored. The expected list is written out by hand."""
    root = tmp_path / "data"
    # Names chosen so that sorted() differs from creation, case-folded and numeric orders.
    layout = {
        "b": ["2.jpg", "10.jpg"],
        "a": ["x.PNG", "deep/1.jpg", "deep/er/0.jpg", "a.txt"],
        "B": ["k.jpeg"],
        "_x": ["m.jpg"],
        "10": ["n.jpg"],
        "9": ["o.jpg", "p.gif"],
        ".hidden": ["q.jpg"],
        "empty": [],
    }
    seed = 0
    for cls, files in layout.items():
        os.makedirs(root / cls)
        for f in files:
            p = root / cls / f
            p.parent.mkdir(parents=True, exist_ok=True)
            seed += 1
            arr = textured(20, 16, seed)
            if f.lower().endswith(".png"):
                p.write_bytes(png_bytes(Image.fromarray(arr)))
            elif f.endswith((".jpg", ".jpeg")):
                p.write_bytes(jpeg_bytes(arr))
            else:
                p.write_bytes(b"not an image")
    (root / "loose.jpg").write_bytes(jpeg_bytes(textured(20, 16, 99)))
    os.symlink(root / "b", root / "link_to_b")  # a symlinked class folder is a class
    classes = [".hidden", "10", "9", "B", "_x", "a", "b", "empty", "link_to_b"]
    expected = [
        (".hidden/q.jpg", 0),
        ("10/n.jpg", 1),
        ("9/o.jpg", 2),
        ("B/k.jpeg", 3),
        ("_x/m.jpg", 4),
        ("a/x.PNG", 5),
        ("a/deep/1.jpg", 5),
        ("a/deep/er/0.jpg", 5),
        ("b/10.jpg", 6),
        ("b/2.jpg", 6),
        ("link_to_b/10.jpg", 8),
        ("link_to_b/2.jpg", 8),
    ]
    items, found_classes = ws.find_images(str(root))
    assert found_classes == classes
    assert [(os.path.relpath(p, root), c) for p, c in items] == expected
    out = tmp_path / "out"
    r = run_cli([str(root), str(out)], cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "empty" in r.stderr and "1 image(s) directly in" in r.stderr
    assert (out / "classes.txt").read_text().splitlines() == classes
    samples = read_tar_samples(str(out))
    assert [int(f["cls"]) for _, f in samples] == [c for _, c in expected]
    for (_, f), (rel, _) in zip(samples, expected):
        (data,) = [v for k, v in f.items() if k != "cls"]
        assert data == (root / rel).read_bytes()
    dl = DataLoader(
        WebDataset(str(out / "shard-*.tar"), fields=("jpg;png", "cls"), crop="resize", size=8), 64
    )
    ((_, labels),) = list(dl)
    assert labels.tolist() == [c for _, c in expected]


@needs_jpeg
def test_image_folder_matches_torchvision_imagefolder(tmp_path):
    tv = pytest.importorskip("torchvision.datasets", reason="torchvision is not installed")
    make_image_folder(str(tmp_path / "train"), per_class=3, classes=("zebra", "Ant", "cat", "a b"))
    ref = tv.ImageFolder(str(tmp_path / "train"))
    items, classes = ws.find_images(str(tmp_path / "train"))
    assert classes == ref.classes
    assert items == [(p, c) for p, c in ref.samples]


@needs_jpeg
def test_write_images_from_a_list(tmp_path):
    expected = make_image_folder(str(tmp_path / "src"), per_class=3, classes=("a", "b", "c"))
    items = [(str(tmp_path / "src" / rel), 2 - c) for rel, c in expected]  # own labelling
    out = str(tmp_path / "out")
    paths = ws.write_images(items, out, maxcount=4, classes=["z", "y", "x"], progress=False)
    assert len(paths) == 3
    assert open(os.path.join(out, "classes.txt")).read().splitlines() == ["z", "y", "x"]
    samples = read_tar_samples(out)
    assert [int(f["cls"]) for _, f in samples] == [c for _, c in items]
    # Shuffled with a seed: a fixed permutation of the same samples.
    a = ws.write_images(items, str(tmp_path / "s1"), shuffle_seed=3, progress=False)
    b = ws.write_images(items, str(tmp_path / "s2"), shuffle_seed=3, progress=False)
    sa, sb = read_tar_samples(str(tmp_path / "s1")), read_tar_samples(str(tmp_path / "s2"))
    assert len(a) == len(b) == 1 and sa == sb
    assert sorted(int(f["cls"]) for _, f in sa) == sorted(c for _, c in items)
    assert [int(f["cls"]) for _, f in sa] != [c for _, c in items]
    with pytest.raises(ws.UsageError, match="out of range"):
        ws.write_images(items, str(tmp_path / "bad"), classes=["only one"], progress=False)
    with pytest.raises(ws.UsageError, match="for every image or for none"):
        ws.write_images([(items[0][0], 1), (items[1][0], None)], str(tmp_path / "bad"))
    assert not os.path.exists(tmp_path / "bad")


# ---- arrays: exact shapes and dtypes through the loader -------------------------------------------
LOADER_DTYPES = [
    np.uint8,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint16,
    np.float16,
    np.float32,
    np.float64,
    np.bool_,
]


def test_1d_labels_load_as_B_not_B1(tmp_path):
    """A 1-D labels array used to come back as [B, 1] (then a loss against [B] broadcasts)."""
    labels = np.arange(10, dtype=np.int64) % 3
    np.save(tmp_path / "labels.npy", labels)
    ws.write_arrays([str(tmp_path / "labels.npy")], ["cls"], str(tmp_path / "out"), maxcount=4)
    got = next(iter(DataLoader(WebDataset(str(tmp_path / "out/shard-*.tar"), "cls.npy"), 4)))
    ref = next(iter(DataLoader(NpySource(str(tmp_path / "labels.npy")), batch_size=4)))
    assert got.shape == ref.shape == (4,)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)


def _as_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


@st.composite
def array_sets(draw):
    n = draw(st.integers(1, 9))
    k = draw(st.integers(1, 3))
    arrs = []
    for _ in range(k):
        dtype = np.dtype(draw(st.sampled_from(LOADER_DTYPES)))
        row_shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3))
        arrs.append(draw(hnp.arrays(dtype, (n, *row_shape))))
    return arrs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrs=array_sets(),
    maxcount=st.integers(1, 4),
    batch_size=st.integers(1, 5),
    fortran=st.booleans(),
)
def test_arrays_round_trip_exactly(arrs, maxcount, batch_size, fortran):
    """Shapes, dtypes and bits equal: source numpy == WebDataset shards == NpySource == torch."""
    with tempfile.TemporaryDirectory() as d:
        paths, c_paths = [], []  # what is sharded; C-order copies for NpySource (C order only)
        for j, a in enumerate(arrs):
            paths.append(os.path.join(d, f"a{j}.npy"))
            np.save(paths[-1], np.asfortranarray(a) if fortran else a)
            c_paths.append(os.path.join(d, f"c{j}.npy"))
            np.save(c_paths[-1], np.ascontiguousarray(a))
        names = [f"f{j}" for j in range(len(arrs))]
        out = os.path.join(d, "out")
        ws.write_arrays(paths, names, out, maxcount=maxcount, progress=False)
        n = len(arrs[0])
        assert len(os.listdir(out)) == 2 * (-(-n // maxcount))
        shards = DataLoader(
            WebDataset(os.path.join(out, "shard-*.tar"), [f"{m}.npy" for m in names]),
            batch_size=batch_size,
        )
        npy = DataLoader(NpySource(c_paths), batch_size=batch_size)
        ref = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(
                *[torch.from_numpy(np.ascontiguousarray(a)) for a in arrs]
            ),
            batch_size=batch_size,
        )
        got = list(zip(shards, npy, ref))
        assert len(got) == -(-n // batch_size)
        for b, (from_shards, from_npy, from_torch) in enumerate(got):
            if len(arrs) == 1:
                from_shards, from_npy = (from_shards,), (from_npy,)
            for a, s, m, t in zip(arrs, from_shards, from_npy, from_torch):
                src = torch.from_numpy(
                    np.ascontiguousarray(a[b * batch_size : (b + 1) * batch_size])
                )
                for x in (s, m, t):
                    assert x.dtype == src.dtype and x.shape == src.shape, (
                        x.dtype,
                        x.shape,
                        src.shape,
                    )
                    assert _as_bytes(x) == _as_bytes(src)


def test_big_endian_and_fortran_arrays_keep_values(tmp_path):
    a = np.arange(24, dtype=">i4").reshape(6, 2, 2)
    f = np.asfortranarray(np.arange(18, dtype=np.float64).reshape(6, 3))
    np.save(tmp_path / "be.npy", a)
    np.save(tmp_path / "f.npy", f)
    out = str(tmp_path / "out")
    ws.write_arrays([str(tmp_path / "be.npy"), str(tmp_path / "f.npy")], None, out)
    be, ff = next(iter(DataLoader(WebDataset(out + "/shard-*.tar", ["be.npy", "f.npy"]), 6)))
    assert be.dtype == torch.int32 and be.shape == (6, 2, 2)
    torch.testing.assert_close(be, torch.from_numpy(a.astype("<i4")), rtol=0, atol=0)
    torch.testing.assert_close(ff, torch.from_numpy(np.ascontiguousarray(f)), rtol=0, atol=0)


def test_shuffled_arrays_stay_aligned(tmp_path):
    x = np.arange(20, dtype=np.int32) * 10
    y = np.arange(20, dtype=np.int64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    out = str(tmp_path / "out")
    ws.write_arrays([str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], None, out, shuffle_seed=1)
    gx, gy = next(iter(DataLoader(WebDataset(out + "/shard-*.tar", ["x.npy", "y.npy"]), 20)))
    assert gy.tolist() != list(range(20)) and sorted(gy.tolist()) == list(range(20))
    torch.testing.assert_close(gx, (gy * 10).to(torch.int32), rtol=0, atol=0)


@needs_jpeg
def test_write_shards_cli(tmp_path):
    src = tmp_path / "imgs"
    for c, name in enumerate(["cat", "dog"]):
        (src / name).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(textured(50, 40, seed=c * 10 + i)).save(src / name / f"{i}.jpg")
    Image.fromarray(textured(50, 40, seed=99)).save(src / "dog" / "x.png")
    out = tmp_path / "shards"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchspeed.data.write_shards",
            str(src),
            str(out),
            "--maxcount",
            "4",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    tars = sorted(str(p) for p in out.glob("*.tar"))
    assert len(tars) == 3 and all(os.path.exists(t + ".idx") for t in tars)
    assert (out / "classes.txt").read_text().split() == ["cat", "dog"]
    dl = DataLoader(
        WebDataset(
            str(out / "shard-{000000..000002}.tar"),
            fields=("jpg;png", "cls"),
            crop="resize",
            size=(40, 50),
        ),
        batch_size=11,
    )
    ((imgs, labels),) = list(dl)
    assert imgs.shape == (11, 3, 40, 50)
    assert labels.tolist() == [0] * 5 + [1] * 6
