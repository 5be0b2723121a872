"""Thin driver for the CMake build: configures, builds and installs CMake's outputs into the package.

CMakeLists.txt is the only build description. This file finds the torch you have installed, builds
against it (so use ``pip install --no-build-isolation .``), and pins that torch version at run time.

Environment knobs: TORCHSPEED_WITH_CUDA=AUTO|ON|OFF; TORCHSPEED_WITH_<SWITCH>=ON|OFF for every
switch of cmake/areas.txt (DATA: the data loader, needs libpng; JPEG: its JPEG decode, needs
libjpeg-turbo; DIST: torchspeed.dist, needs torch built with c10d; QUANT; PRUNE);
TORCHSPEED_BUILD_DIR (default build/py), CMAKE_ARGS (extra -D options), MAX_JOBS (parallel compile
jobs), CMAKE_BUILD_TYPE (default Release).
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _version() -> str:
    """The version, from the one place it is written: project(torchspeed VERSION x.y.z)."""
    import re

    text = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(r"project\(torchspeed\s+VERSION\s+([0-9.]+)", text)
    if m is None:
        sys.exit("setup.py: no 'project(torchspeed VERSION x.y.z)' in CMakeLists.txt")
    return m.group(1)


def _switches() -> list:
    """The build switches (DATA, JPEG, DIST, ...), from the one list of areas: cmake/areas.txt."""
    switches = []
    for line in (ROOT / "cmake" / "areas.txt").read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) >= 2 and not line.startswith("#") and fields[1] != "-":
            switches.append(fields[1])
    return switches


def _torch():
    try:
        import torch
    except ImportError:
        # pip's build isolation runs this in a fresh environment (its path holds pip-build-env-*)
        # where the user's torch is not importable, installed or not.
        if any("pip-build-env" in p for p in sys.path):
            sys.exit(
                "torchspeed builds against the torch of the environment you install it into, and "
                "pip's build isolation hides it (pip builds in a fresh environment).\nBuild with "
                "build isolation off: pip install --no-build-isolation . (with torch installed "
                "first: pip install torch==2.13.0)"
            )
        sys.exit(
            "torchspeed builds against the torch already installed in this environment, and none "
            "was found.\nInstall it first (pip install torch==2.13.0), then build with build "
            "isolation off: pip install --no-build-isolation ."
        )
    return torch


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        torch = _torch()
        package_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        if getattr(self, "editable_mode", False) or self.inplace:
            # Editable install: the package is the source folder; install CMake's outputs there
            # (lib/, include/, share/, _C, build_info.json; all git-ignored).
            package_dir = ROOT / "python" / "torchspeed"
        build_dir = Path(os.environ.get("TORCHSPEED_BUILD_DIR", ROOT / "build" / "py")).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            f"-DCMAKE_BUILD_TYPE={os.environ.get('CMAKE_BUILD_TYPE', 'Release')}",
            f"-DCMAKE_INSTALL_PREFIX={package_dir}",
            "-DCMAKE_INSTALL_LIBDIR=lib",
            "-DTORCHSPEED_PYTHON_INSTALL_DIR=.",
            "-DTORCHSPEED_BUILD_PYTHON=ON",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DTORCHSPEED_WITH_CUDA={os.environ.get('TORCHSPEED_WITH_CUDA', 'AUTO')}",
        ]
        # Only when set: otherwise a build folder keeps what an earlier CMAKE_ARGS chose.
        for knob in (f"TORCHSPEED_WITH_{switch}" for switch in _switches()):
            if os.environ.get(knob):
                args.append(f"-D{knob}={os.environ[knob]}")
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            args += ["-G", "Ninja"]
        extra = shlex.split(os.environ.get("CMAKE_ARGS", ""))
        env = dict(os.environ)
        # ccache, when installed, as scripts/ccache.sh sets it up: a reinstall recompiles only
        # what changed (unless CMAKE_ARGS chooses its own launcher).
        if shutil.which("ccache") and not any("COMPILER_LAUNCHER" in a for a in extra):
            args += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in ("C", "CXX", "CUDA")]
            env.setdefault("CCACHE_BASEDIR", str(ROOT))
        args += extra
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args], env=env)
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs], env=env)
        subprocess.check_call(["cmake", "--install", str(build_dir)], env=env)
        expected = Path(self.get_ext_fullpath(ext.name)).resolve()
        if expected.parent != package_dir:  # editable: setuptools copies _C from its build dir
            expected.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(package_dir / expected.name, expected)


def _torch_requirement() -> list:
    try:
        import torch
    except ImportError:
        return []
    # The binary links this torch's C++ ABI: run it with the same release.
    return [f"torch=={torch.__version__.split('+')[0]}"]


setup(
    name="torchspeed",
    version=_version(),
    description="LibTorch extension toolkit that makes PyTorch training faster",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    package_dir={"": "python"},
    packages=find_packages("python"),
    # Data files inside the package: the profile benchmark's C floor probe.
    package_data={"torchspeed.benchmarks.profile": ["floor.c"]},
    ext_modules=[CMakeExtension("torchspeed._C")],
    cmdclass={"build_ext": CMakeBuild},
    install_requires=_torch_requirement() + ["numpy", "tqdm"],
    # pip install torchspeed[bench]: the loader benchmark (and write_shards conversions) use Pillow.
    # pip install torchspeed[demo]: `torchspeed demo` (Pillow for its images and its PyTorch
    # baseline, matplotlib for demo.png; without matplotlib it writes everything but the PNG).
    extras_require={"bench": ["pillow"], "demo": ["pillow", "matplotlib"]},
    entry_points={"console_scripts": ["torchspeed=torchspeed.cli:main"]},
    zip_safe=False,
)
