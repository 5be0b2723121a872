"""Build configuration: configure-only CMake runs (a missing JPEG/PNG library stops configure, naming
the packages and the option; an OFF build reports itself truthfully), the JPEG-off decode error, and
the installed libraries loading by their own RUNPATH with LD_LIBRARY_PATH unset."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchspeed

ROOT = Path(__file__).resolve().parents[2]
TORCH_LIB = Path(torch.__file__).resolve().parent / "lib"
PACKAGE_LIB = Path(torchspeed.__file__).resolve().parent / "lib"

needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not on PATH")


# The image pipeline's three sources (csrc/data/image_*.cpp).
IMAGE_PARTS = ("decode", "resample", "transform")


def _configure(build_dir: Path, *defs: str) -> subprocess.CompletedProcess:
    """Configure only (no compile): the C++ library alone, CPU, into build_dir."""
    args = [
        "cmake",
        "-S",
        str(ROOT),
        "-B",
        str(build_dir),
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        "-DTORCHSPEED_BUILD_PYTHON=OFF",
        "-DTORCHSPEED_WITH_CUDA=OFF",
        *defs,
    ]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def _flat(proc: subprocess.CompletedProcess) -> str:
    # CMake wraps messages at word boundaries: compare with whitespace collapsed.
    return " ".join((proc.stdout + proc.stderr).split())


def _switches() -> list:
    """The build switches of cmake/areas.txt, the one list of areas (DATA, JPEG, DIST, ...)."""
    lines = (ROOT / "cmake" / "areas.txt").read_text().splitlines()
    return [
        f[1]
        for f in (line.split() for line in lines if not line.startswith("#"))
        if f[1:2] != ["-"] and len(f) > 1
    ]


def _all_on(**off: str) -> dict:
    return {f"TORCHSPEED_WITH_{s}": off.get(f"TORCHSPEED_WITH_{s}", "ON") for s in _switches()}


def _features(build_dir: Path) -> dict:
    return json.loads((build_dir / "build_info.json").read_text())


@needs_cmake
def test_configure_without_turbojpeg_fails_naming_packages_and_option(tmp_path):
    proc = _configure(tmp_path / "b", f"-DTORCHSPEED_TURBOJPEG_INCLUDE_DIR={tmp_path / 'none'}")
    out = _flat(proc)
    assert proc.returncode != 0, out
    assert "JPEG decode needs libjpeg-turbo" in out
    assert "TurboJPEG API (turbojpeg.h" in out
    for needle in ("libturbojpeg0-dev", "libjpeg62-turbo-dev", "-DTORCHSPEED_WITH_JPEG=OFF"):
        assert needle in out, needle


@needs_cmake
def test_configure_without_libjpeg_api_fails_naming_package(tmp_path):
    proc = _configure(tmp_path / "b", f"-DTORCHSPEED_LIBJPEG_LIBRARY={tmp_path / 'libjpeg.so'}")
    out = _flat(proc)
    assert proc.returncode != 0, out
    assert "libjpeg API (jpeglib.h, libjpeg; Debian package libjpeg62-turbo-dev)" in out
    assert "TurboJPEG API (turbojpeg.h" not in out  # only what is missing is listed
    assert "-DTORCHSPEED_WITH_JPEG=OFF" in out


@needs_cmake
def test_configure_without_libpng_fails_naming_package_and_option(tmp_path):
    proc = _configure(tmp_path / "b", "-DCMAKE_DISABLE_FIND_PACKAGE_PNG=ON")
    out = _flat(proc)
    assert proc.returncode != 0, out
    assert "PNG decode needs libpng" in out
    assert "libpng-dev" in out and "-DTORCHSPEED_WITH_DATA=OFF" in out


@needs_cmake
def test_configure_jpeg_off_needs_no_libjpeg_and_reports_it(tmp_path):
    proc = _configure(
        tmp_path / "b",
        "-DTORCHSPEED_WITH_JPEG=OFF",
        f"-DTORCHSPEED_TURBOJPEG_INCLUDE_DIR={tmp_path / 'none'}",
        f"-DTORCHSPEED_LIBJPEG_INCLUDE_DIR={tmp_path / 'none'}",
    )
    assert proc.returncode == 0, _flat(proc)
    info = _features(tmp_path / "b")
    assert {"data", "png"} <= set(info["features"])
    assert not {"jpeg", "jpeg-region-decode"} & set(info["features"])
    assert info["options"] == _all_on(TORCHSPEED_WITH_JPEG="OFF")


@needs_cmake
def test_configure_data_off_needs_no_image_libraries_and_reports_it(tmp_path):
    proc = _configure(
        tmp_path / "b",
        "-DTORCHSPEED_WITH_DATA=OFF",
        "-DCMAKE_DISABLE_FIND_PACKAGE_PNG=ON",
        f"-DTORCHSPEED_TURBOJPEG_INCLUDE_DIR={tmp_path / 'none'}",
    )
    assert proc.returncode == 0, _flat(proc)
    info = _features(tmp_path / "b")
    assert not {"data", "png", "jpeg", "jpeg-region-decode"} & set(info["features"])
    assert info["options"] == _all_on(TORCHSPEED_WITH_DATA="OFF", TORCHSPEED_WITH_JPEG="OFF")


@needs_cmake
@pytest.mark.parametrize("switch", ["DIST", "QUANT", "PRUNE"])
def test_configure_area_off_reports_it_everywhere(tmp_path, switch):
    # One list of areas drives every switch: the option, build_info.json, the CMake package.
    area = switch.lower()
    proc = _configure(tmp_path / "b", f"-DTORCHSPEED_WITH_{switch}=OFF")
    assert proc.returncode == 0, _flat(proc)
    info = _features(tmp_path / "b")
    assert area not in info["features"]
    assert info["options"] == _all_on(**{f"TORCHSPEED_WITH_{switch}": "OFF"})
    config = (tmp_path / "b" / "torchspeedConfig.cmake").read_text()
    for s in _switches():
        value = "OFF" if s == switch else "ON"
        assert f"set(torchspeed_WITH_{s} {value})" in config, s
    # None of the area's sources is compiled: the other areas' lists name only their own files.
    ninja = (tmp_path / "b" / "build.ninja").read_text()
    own = {"dist": "ops/dist.cpp", "quant": "ops/quant.cpp", "prune": "ops/prune.cpp"}[area]
    assert own not in ninja
    assert f"{area}_cpu.cpp" not in ninja and f"{area}_meta.cpp" not in ninja
    if area == "quant":
        assert "int8_linear_cpu.cpp" not in ninja


@needs_cmake
@pytest.mark.skipif(shutil.which("ninja") is None, reason="reads build.ninja")
def test_area_definitions_stay_on_the_area_sources(tmp_path):
    # An area's definitions reach its own sources only, so turning an area off leaves every
    # other object's command line alone (what ccache needs for cheap area-OFF builds).
    proc = _configure(tmp_path / "b")
    assert proc.returncode == 0, _flat(proc)
    ninja = (tmp_path / "b" / "build.ninja").read_text()
    defines = {}
    for block in ninja.split("\nbuild ")[1:]:
        head, _, body = block.partition("\n")
        obj = head.split(":")[0]
        for line in body.splitlines():
            if line.strip().startswith("DEFINES ="):
                defines[obj] = line
    optim = [d for o, d in defines.items() if o.endswith("csrc/ops/optim.cpp.o")]
    data = [d for o, d in defines.items() if o.endswith("csrc/data/image_decode.cpp.o")]
    assert optim and data, sorted(defines)[:5]
    assert "TORCHSPEED_WITH_JPEG" in data[0]
    assert "TORCHSPEED_WITH_JPEG" not in optim[0] and "TORCHSPEED_AREA_" not in optim[0]


def test_info_reports_the_build_options():
    from torchspeed import info

    data = info.collect()
    options = dict(o.split("=", 1) for o in data["build_options"])
    assert options["TORCHSPEED_WITH_DATA"] == ("ON" if "data" in data["features"] else "OFF")
    assert options["TORCHSPEED_WITH_JPEG"] == ("ON" if "jpeg" in data["features"] else "OFF")
    for switch in ("DIST", "QUANT", "PRUNE"):
        built = switch.lower() in data["features"]
        assert options[f"TORCHSPEED_WITH_{switch}"] == ("ON" if built else "OFF")


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")
def test_jpeg_decode_in_a_jpeg_off_build_names_the_option(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    # The torch-free decoder compiled exactly as a TORCHSPEED_WITH_JPEG=OFF build compiles it.
    exe = tmp_path / "decode_without_jpeg"
    png_flags = ["-lpng"]
    if shutil.which("pkg-config"):
        pc = subprocess.run(
            ["pkg-config", "--cflags", "--libs", "libpng"], capture_output=True, text=True
        )
        if pc.returncode == 0:
            png_flags = shlex.split(pc.stdout)
    cmd = [
        os.environ.get("CXX", "c++"),
        "-std=c++17",
        "-O0",
        "-DTORCHSPEED_WITH_JPEG=0",
        f"-I{ROOT / 'include'}",
        f"-I{ROOT / 'csrc'}",
        # The resampler runs in the CPU kernel layer: its scalar unit and the dispatcher.
        "-DTORCHSPEED_CPU_ISA_NAMESPACE=isa_scalar",
        str(ROOT / "tests" / "build_config" / "decode_without_jpeg.cpp"),
        *(str(ROOT / "csrc" / "data" / f"image_{part}.cpp") for part in IMAGE_PARTS),
        str(ROOT / "csrc" / "kernels" / "cpu" / "isa_scalar.cpp"),
        str(ROOT / "csrc" / "kernels" / "cpu" / "dispatch.cpp"),
        # The decoder times itself on the one clock, the torch-free profiler core's.
        *(str(p) for p in sorted((ROOT / "csrc" / "profile").glob("*.cpp"))),
        "-DTORCHSPEED_BUILDING_LIBRARY",
        "-o",
        str(exe),
        *png_flags,
        "-lpthread",
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    jpg, png = tmp_path / "a.jpg", tmp_path / "a.png"
    Image.new("RGB", (9, 7), (200, 30, 10)).save(jpg, quality=95)
    Image.new("RGB", (9, 7), (200, 30, 10)).save(png)

    run = subprocess.run([str(exe), str(jpg)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 3, run.stdout + run.stderr
    assert "jpeg_supported=0" in run.stdout
    assert "torchspeed.data.decode: JPEG decode is not in this build" in run.stdout
    assert "TORCHSPEED_WITH_JPEG=OFF" in run.stdout and "libturbojpeg0-dev" in run.stdout
    # PNG still decodes in such a build.
    run = subprocess.run([str(exe), str(png)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "decoded 9x7" in run.stdout, run.stdout + run.stderr


def _env_without_ld_library_path() -> dict:
    env = dict(os.environ)
    env.pop("LD_LIBRARY_PATH", None)
    return env


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RUNPATH is an ELF (Linux) feature"
)
def test_libtorchspeed_loads_by_its_own_runpath_without_torch_loaded():
    # A process that has not imported torch: libc10/libtorch_cpu/libgomp must come from
    # libtorchspeed's RUNPATH, as for dlopen from a plugin host or a C++ app that lacks them.
    lib = PACKAGE_LIB / "libtorchspeed.so"
    assert lib.exists(), f"no {lib}"
    code = (
        "import ctypes, sys\n"
        f"ctypes.CDLL({str(lib)!r})\n"
        "assert 'torch' not in sys.modules\n"
        "maps = open('/proc/self/maps').read().split()\n"
        "print('\\n'.join(sorted({p for p in maps if '/libgomp' in p or '/libc10.so' in p})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env_without_ld_library_path(),
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    loaded = [Path(p).resolve() for p in proc.stdout.split()]
    assert (TORCH_LIB / "libc10.so").resolve() in loaded, proc.stdout
    if (TORCH_LIB / "libgomp.so.1").exists():
        # One OpenMP runtime in the process, torch's own, not the system's.
        gomp = [p for p in loaded if "libgomp" in p.name]
        assert gomp == [(TORCH_LIB / "libgomp.so.1").resolve()], proc.stdout


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RUNPATH is an ELF (Linux) feature"
)
def test_c_module_imports_with_ld_library_path_unset():
    code = "import torchspeed._C as C, torchspeed; assert C.version() == torchspeed.__version__"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env_without_ld_library_path(),
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
