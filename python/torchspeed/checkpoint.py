"""Checkpoints that resume bitwise and never lose the previous one, and early stopping.

    torchspeed.checkpoint.save("ckpt.pt", model=model, optimizer=opt, loader=loader, scaler=scaler)
    extra = torchspeed.checkpoint.load("ckpt.pt", model=model, optimizer=opt, loader=loader,
                                       scaler=scaler)

    manager = torchspeed.checkpoint.CheckpointManager("runs/x", keep=2)
    manager.save(step, model=model, optimizer=opt, loader=loader, scaler=scaler)
    step = manager.load_latest(model=model, optimizer=opt, loader=loader, scaler=scaler)

One call saves every object given (anything with ``state_dict``/``load_state_dict``: the model,
the optimizer with its fp32 masters, torchspeed's loader position, the GradScaler, an LR scheduler)
and the RNG states (torch CPU and CUDA, numpy, Python's ``random``). The file is written to a
temporary name in the same folder, fsynced, then renamed over the target (and the folder fsynced),
so a crash at any point leaves either the old file or the new one, never a torn one. The file
starts with a magic, the payload's length and its SHA-256: a truncated or corrupted file is refused
with a clear error before anything is restored.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import struct
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

_MAGIC = b"TSCKPT\x00\x01"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of the payload
_NAME = "torchspeed.checkpoint"


class CheckpointError(RuntimeError):
    """A checkpoint file that is truncated, corrupted or not a torchspeed checkpoint."""


# ---- RNG states -----------------------------------------------------------------------------------


def rng_state() -> Dict[str, Any]:
    """The RNG states a resumed run needs: torch CPU, every CUDA device (when CUDA is initialised),
    numpy's global generator (when numpy is imported) and Python's ``random``."""
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


# ---- one file -------------------------------------------------------------------------------------


def _states(objects: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for name, obj in objects.items():
        if obj is None:
            continue
        if not hasattr(obj, "state_dict"):
            raise TypeError(
                f"{_NAME}.save: {name} must have a state_dict() (a module, optimizer, loader, "
                f"GradScaler, scheduler...), got {type(obj).__name__}"
            )
        out[name] = obj.state_dict()
    return out


def save(path, *, extra: Optional[dict] = None, rng: bool = True, **objects: Any) -> Path:
    """Atomically writes the state of every object given (model=, optimizer=, loader=, scaler=,
    scheduler=, any name) plus ``extra`` (a picklable dict: the step, metrics) and the RNG states.

    The previous file at ``path`` stays intact until the new one is complete on disk."""
    path = Path(path)
    payload = {"format": 1, "states": _states(objects), "extra": dict(extra or {})}
    if rng:
        payload["rng"] = rng_state()
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    header = _HEADER.pack(_MAGIC, len(data), hashlib.sha256(data).digest())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read(path, map_location: Any = "cpu") -> Dict[str, Any]:
    """The verified payload of a checkpoint file ({"states", "extra", "rng"}); raises
    CheckpointError for a missing, truncated, corrupted or foreign file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{_NAME}: {path} does not exist") from None
    if len(raw) < _HEADER.size:
        raise CheckpointError(
            f"{_NAME}: {path} is truncated: {len(raw)} bytes, shorter than the "
            f"{_HEADER.size}-byte header"
        )
    magic, length, digest = _HEADER.unpack_from(raw)
    if magic != _MAGIC:
        raise CheckpointError(f"{_NAME}: {path} is not a torchspeed checkpoint (bad magic)")
    body = raw[_HEADER.size :]
    if len(body) != length:
        raise CheckpointError(
            f"{_NAME}: {path} is truncated: the header announces {length} bytes of payload, "
            f"the file holds {len(body)}"
        )
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(
            f"{_NAME}: {path} is corrupted: the SHA-256 of its payload does not match"
        )
    return torch.load(io.BytesIO(body), map_location=map_location, weights_only=False)


def load(
    path, *, rng: bool = True, map_location: Any = "cpu", strict: bool = True, **objects: Any
) -> dict:
    """Verifies ``path``, then restores every object given from it (and the RNG states); returns
    the ``extra`` dict saved with it. Every object named must be in the file (KeyError otherwise,
    before anything is restored)."""
    payload = read(path, map_location)
    states = payload["states"]
    missing = [n for n, o in objects.items() if o is not None and n not in states]
    if missing:
        raise KeyError(
            f"{_NAME}.load: {path} holds no state for {', '.join(missing)} (it has "
            f"{', '.join(sorted(states)) or 'nothing'})"
        )
    for name, obj in objects.items():
        if obj is None:
            continue
        if isinstance(obj, torch.nn.Module):
            obj.load_state_dict(states[name], strict=strict)
        else:
            obj.load_state_dict(states[name])
    if rng and "rng" in payload:
        set_rng_state(payload["rng"])
    return payload["extra"]


# ---- a folder of checkpoints --------------------------------------------------------------------


class CheckpointManager:
    """Numbered checkpoints ``<prefix>-<step>.pt`` in ``directory``, the newest ``keep`` kept.

    ``load_latest`` restores the newest file that verifies; a truncated or corrupted newest file
    is reported (a warning) and the one before it is used, so the previous checkpoint is never
    lost to a crash during a save."""

    def __init__(self, directory, keep: int = 2, prefix: str = "ckpt") -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"{_NAME}.CheckpointManager: keep must be an int >= 1, got {keep!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
            raise ValueError(
                f"{_NAME}.CheckpointManager: prefix must be a plain file name part, got {prefix!r}"
            )
        self.directory = Path(directory)
        self.keep = keep
        self.prefix = prefix
        self._pattern = re.compile(rf"{re.escape(prefix)}-(\d+)\.pt")

    def path(self, step: int) -> Path:
        return self.directory / f"{self.prefix}-{int(step):09d}.pt"

    def checkpoints(self) -> List[Path]:
        """The numbered files, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.directory.iterdir()
            if (m := self._pattern.fullmatch(p.name))
        ]
        return [p for _, p in sorted(found)]

    def save(self, step: int, extra: Optional[dict] = None, **objects: Any) -> Path:
        path = save(self.path(step), extra={**(extra or {}), "step": int(step)}, **objects)
        for old in self.checkpoints()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path

    def latest(self) -> Optional[Path]:
        """The newest checkpoint that verifies, or None."""
        for p in reversed(self.checkpoints()):
            try:
                read(p)
                return p
            except CheckpointError as e:
                warnings.warn(f"{e}; trying the previous checkpoint", RuntimeWarning, stacklevel=2)
        return None

    def load_latest(self, **objects: Any) -> Optional[int]:
        """Restores the newest valid checkpoint into the objects; returns its step, or None when
        there is none (a fresh run)."""
        p = self.latest()
        if p is None:
            return None
        return int(load(p, **objects)["step"])


# ---- early stopping -------------------------------------------------------------------------------


class EarlyStopping:
    """Stops when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` checks,
    keeping the best checkpoint (``best_path``) and saying why it stopped.

        stopper = EarlyStopping("val_loss", patience=3, best_path="runs/x/best.pt")
        for epoch in range(100):
            ...
            if stopper.step(val_loss, model=model, optimizer=opt):
                print(stopper.reason); break
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        patience: int = 3,
        min_delta: float = 0.0,
        mode: str = "min",
        best_path=None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"{_NAME}.EarlyStopping: mode must be 'min' or 'max', got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(
                f"{_NAME}.EarlyStopping: patience must be an int >= 0, got {patience!r}"
            )
        if not min_delta >= 0:
            raise ValueError(f"{_NAME}.EarlyStopping: min_delta must be >= 0, got {min_delta!r}")
        self.monitor, self.patience, self.min_delta, self.mode = (
            monitor,
            patience,
            float(min_delta),
            mode,
        )
        self.best_path = Path(best_path) if best_path is not None else None
        self.best: Optional[float] = None
        self.best_check = -1
        self.checks = 0
        self.bad_checks = 0
        self.stopped = False
        self.reason = ""

    def _improved(self, value: float) -> bool:
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def step(self, value: float, **objects: Any) -> bool:
        """Records one check of the monitored value; saves ``objects`` to ``best_path`` when it
        improved. Returns True when training should stop (reason in ``.reason``)."""
        value = float(value)
        if value != value:  # NaN never improves; it counts against the patience
            improved = False
        else:
            improved = self._improved(value)
        if improved:
            self.best, self.best_check, self.bad_checks = value, self.checks, 0
            if self.best_path is not None and objects:
                save(
                    self.best_path,
                    extra={"monitor": self.monitor, "best": value, "check": self.checks},
                    **objects,
                )
        else:
            self.bad_checks += 1
        self.checks += 1
        if self.bad_checks > self.patience:
            self.stopped = True
            self.reason = (
                f"early stopping: {self.monitor} did not improve by more than {self.min_delta:g} "
                f"({self.mode}) for {self.bad_checks} checks (patience {self.patience}); best "
                f"{self.best!r} at check {self.best_check}"
                + (f", saved to {self.best_path}" if self.best_path is not None else "")
            )
        return self.stopped

    def state_dict(self) -> dict:
        return {
            k: getattr(self, k)
            for k in ("best", "best_check", "checks", "bad_checks", "stopped", "reason")
        }

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)


__all__ = [
    "save",
    "load",
    "read",
    "CheckpointError",
    "CheckpointManager",
    "EarlyStopping",
    "rng_state",
    "set_rng_state",
]
