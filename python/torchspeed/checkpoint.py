"""Checkpoints that resume bitwise and never lose the previous one, and early stopping.

    torchspeed.checkpoint.save("ckpt.pt", model=model, optimizer=opt, loader=loader, scaler=scaler)
    extra = torchspeed.checkpoint.load("ckpt.pt", model=model, optimizer=opt, loader=loader,
                                       scaler=scaler)

    manager = torchspeed.checkpoint.CheckpointManager("runs/x", keep=2)
    manager.save(step, model=model, optimizer=opt, loader=loader, scaler=scaler)
    step = manager.load_latest(model=model, optimizer=opt, loader=loader, scaler=scaler)

One call saves every object given (anything with ``state_dict``/``load_state_dict``: the model,
the optimizer with its fp32 masters, torchspeed's loader position, the GradScaler, an LR scheduler)
and the RNG states (torch CPU and CUDA, numpy, Python's ``random``). The file is written by
torchspeed's one atomic write (``torchspeed._atomic``: a unique temporary in the same folder,
fsynced, renamed over the target, the folder fsynced), so a crash at any point leaves either the
old file or the new one, never a torn one. The file starts with a magic, the payload's length and
its SHA-256: a truncated or corrupted file is refused with a clear error before anything is
restored.

Loading never runs code from the file: the payload is read with ``torch.load(weights_only=True)``
(tensors, numbers, strings, lists, tuples, dicts), and ``save`` refuses anything else up front.
``trusted=True`` (on both) allows arbitrary pickled objects. The SHA-256 proves integrity, not who
wrote the file: pass ``trusted=True`` only for files you made yourself.
"""

from __future__ import annotations

import copy
import hashlib
import io
import numbers
import operator
import os
import pickle
import random
import re
import stat
import struct
import sys
import warnings
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from ._atomic import NotARegularFileError, atomic_write, file_kind, remove_stale_temps

_MAGIC = b"TSCKPT\x00\x01"
_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of the payload
_NAME = "torchspeed.checkpoint"
_FORMAT = 2  # 2: RNG states as tensors/numbers (weights_only); 1: numpy's state as a pickled tuple


class CheckpointError(RuntimeError):
    """A checkpoint file that is truncated, corrupted, not a torchspeed checkpoint, unreadable
    without ``trusted=True``, or does not match the objects it is loaded into."""


def _check_path(path, who: str) -> Path:
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise TypeError(
            f"{_NAME}.{who}: path must be a str or os.PathLike, got {type(path).__name__}"
        )
    if os.fspath(path) == "":
        raise ValueError(f"{_NAME}.{who}: path must not be empty")
    return Path(path)


def _check_flag(value, name: str, who: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{_NAME}.{who}: {name} must be a bool, got {value!r}")
    return value


# ---- what weights_only loading accepts ----------------------------------------------------------

_SAFE_LEAVES = (
    type(None), bool, int, float, complex, str, bytes, bytearray,
    torch.dtype, torch.device, torch.Size,
)  # fmt: skip
_SAFE_CONTAINERS = (dict, OrderedDict, Counter, list, tuple, set)


def _unsafe(value, where: str) -> Optional[str]:
    """The first place in ``value`` that torch.load(weights_only=True) would refuse, or None.
    Exact types: numpy's float64 is a float subclass that pickles as a numpy object."""
    t = type(value)
    if t in _SAFE_LEAVES:
        return None
    if isinstance(value, torch.Tensor):
        if t in (torch.Tensor, torch.nn.Parameter) or t in _safe_globals():
            return None
        return f"{where} is a {t.__module__}.{t.__qualname__}"
    if t in _SAFE_CONTAINERS:
        if isinstance(value, dict):
            for k, v in value.items():
                bad = _unsafe(k, f"{where} key {k!r}") or _unsafe(v, f"{where}[{k!r}]")
                if bad:
                    return bad
        else:
            for i, v in enumerate(value):
                bad = _unsafe(v, f"{where}[{i}]")
                if bad:
                    return bad
        return None
    if t in _safe_globals():
        return None
    return f"{where} is a {t.__module__}.{t.__qualname__}"


def _safe_globals() -> set:
    """Types the user registered with torch.serialization.add_safe_globals."""
    out = set()
    for g in torch.serialization.get_safe_globals():
        out.add(g[0] if isinstance(g, tuple) else g)
    return out


# ---- RNG states -----------------------------------------------------------------------------------


def rng_state() -> Dict[str, Any]:
    """The RNG states a resumed run needs: torch CPU, every CUDA device (when CUDA is initialised),
    numpy's global generator (when numpy is imported) and Python's ``random``. Only tensors,
    numbers, strings, tuples and dicts: a checkpoint holding it loads with weights_only."""
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        s = np.random.get_state(legacy=False)
        state["numpy"] = {
            "bit_generator": str(s["bit_generator"]),
            "key": torch.from_numpy(s["state"]["key"].astype(np.int64)),
            "pos": int(s["state"]["pos"]),
            "has_gauss": int(s["has_gauss"]),
            "gauss": float(s["gauss"]),
        }
    return state


def _numpy_state(saved):
    """numpy's set_state argument from a saved state: the dict of format 2, or the legacy tuple
    of format 1 (loaded with trusted=True)."""
    import numpy as np  # optional: only when the checkpoint holds a numpy state

    if isinstance(saved, dict):
        key = saved["key"]
        if not (isinstance(key, torch.Tensor) and key.dtype == torch.int64 and key.dim() == 1):
            raise TypeError(f"rng['numpy']['key'] must be a 1-D int64 tensor, got {key!r}")
        return {
            "bit_generator": saved["bit_generator"],
            "state": {"key": key.numpy().astype(np.uint32), "pos": int(saved["pos"])},
            "has_gauss": int(saved["has_gauss"]),
            "gauss": float(saved["gauss"]),
        }
    return saved


def _check_rng_state(state) -> None:
    """Raises (ValueError/TypeError naming the entry) unless set_rng_state(state) would succeed;
    tried on private generators, so nothing global changes."""
    if not isinstance(state, Mapping) or "torch" not in state or "python" not in state:
        raise ValueError(
            f"{_NAME}: rng must be a dict with 'torch' and 'python' (from rng_state()), got "
            f"{type(state).__name__} with keys {sorted(state) if isinstance(state, Mapping) else []}"
        )
    unknown = set(state) - {"torch", "python", "cuda", "numpy"}
    if unknown:
        raise ValueError(f"{_NAME}: rng has unknown entries {sorted(unknown)}")
    try:
        torch.Generator().set_state(state["torch"])
        random.Random().setstate(state["python"])
        if "cuda" in state:
            cuda = state["cuda"]
            if not isinstance(cuda, (list, tuple)) or not all(
                isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda
            ):
                raise TypeError("rng['cuda'] must be a list of uint8 tensors")
        if "numpy" in state:
            import numpy as np  # optional: only when the checkpoint holds a numpy state

            np.random.RandomState().set_state(_numpy_state(state["numpy"]))
    except (TypeError, ValueError, RuntimeError, KeyError, ImportError) as e:
        raise ValueError(f"{_NAME}: the saved RNG state is not valid: {e}") from None


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restores :func:`rng_state`'s dict (checked whole before anything is set)."""
    _check_rng_state(state)
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        # Saved on more devices than this process sees: the ones it has are restored.
        for i, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)
    if "numpy" in state:
        import numpy as np  # optional: only when the checkpoint holds a numpy state

        np.random.set_state(_numpy_state(state["numpy"]))


# ---- one file -------------------------------------------------------------------------------------


def _states(objects: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    for name, obj in objects.items():
        if obj is None:
            continue
        if not callable(getattr(obj, "state_dict", None)):
            raise TypeError(
                f"{_NAME}.save: {name} must have a state_dict() (a module, optimizer, loader, "
                f"GradScaler, scheduler...), got {type(obj).__name__}"
            )
        out[name] = obj.state_dict()
    return out


def save(
    path,
    *,
    extra: Optional[dict] = None,
    rng: bool = True,
    trusted: bool = False,
    **objects: Any,
) -> Path:
    """Atomically writes the state of every object given (model=, optimizer=, loader=, scaler=,
    scheduler=, any name) plus ``extra`` (a dict: the step, metrics) and the RNG states.

    The previous file at ``path`` stays intact until the new one is complete on disk. Everything
    saved must load with ``torch.load(weights_only=True)`` (tensors, numbers, strings, bytes,
    lists, tuples, sets, dicts, dtypes, devices): anything else is a TypeError naming where it is,
    before anything is written, unless ``trusted=True`` (which ``load`` then needs too).
    A ``path`` that exists and is not a regular file (a directory, a FIFO, a device) is a
    CheckpointError."""
    path = _check_path(path, "save")
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"{_NAME}.save: extra must be a dict or None, got {type(extra).__name__}")
    _check_flag(rng, "rng", "save")
    _check_flag(trusted, "trusted", "save")
    payload = {"format": _FORMAT, "states": _states(objects), "extra": dict(extra or {})}
    if rng:
        payload["rng"] = rng_state()
    if not trusted:
        bad = _unsafe(payload["states"], "states") or _unsafe(payload["extra"], "extra")
        if bad:
            raise TypeError(
                f"{_NAME}.save: {bad}, which a weights_only load refuses; store tensors, numbers, "
                "strings, lists or dicts (float(x), x.tolist()), or pass trusted=True to save and "
                "to load"
            )
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    header = _HEADER.pack(_MAGIC, len(data), hashlib.sha256(data).digest())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CheckpointError(
            f"{_NAME}.save: cannot create the folder of {path}: a part of it is a file"
        ) from None

    def write(f):
        f.write(header)
        f.write(data)

    try:
        atomic_write(path, write, who=f"{_NAME}.save")
    except NotARegularFileError as e:
        raise CheckpointError(e.strerror) from None
    return path


def _verified_body(path: Path, who: str) -> bytes:
    """The payload bytes of a checkpoint file whose header and SHA-256 check out."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{_NAME}: {path} does not exist") from None
    except NotADirectoryError:
        raise CheckpointError(f"{_NAME}: {path} does not exist (a parent is a file)") from None
    if not stat.S_ISREG(st.st_mode):
        # Never open a FIFO or a device: a read could block forever or never end.
        raise CheckpointError(
            f"{_NAME}.{who}: {path} is {file_kind(st.st_mode)}, not a checkpoint file"
        )
    raw = path.read_bytes()
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
    return body


def _unpickle(body: bytes, path: Path, map_location: Any, trusted: bool) -> Dict[str, Any]:
    try:
        payload = torch.load(io.BytesIO(body), map_location=map_location, weights_only=not trusted)
    except pickle.UnpicklingError as e:
        if trusted:
            raise
        lines = [ln.strip() for ln in str(e).splitlines()]
        found = [ln for ln in lines if "Unsupported global" in ln or "WeightsUnpickler" in ln]
        first = re.sub(r"\x1b\[[0-9;]*m", "", (found or lines or [type(e).__name__])[0])
        raise CheckpointError(
            f"{_NAME}: {path} holds objects other than tensors, numbers, strings, lists and dicts, "
            f"which loading refuses by default ({first}). Loading it with trusted=True runs code "
            "the file carries: do so only for a file you made yourself"
        ) from None
    if not (
        isinstance(payload, dict)
        and isinstance(payload.get("states"), dict)
        and isinstance(payload.get("extra"), dict)
        and isinstance(payload.get("format"), int)
    ):
        raise CheckpointError(f"{_NAME}: {path} does not hold a torchspeed checkpoint payload")
    if payload["format"] > _FORMAT:
        raise CheckpointError(
            f"{_NAME}: {path} has format {payload['format']}, newer than this torchspeed reads "
            f"({_FORMAT}); upgrade torchspeed"
        )
    return payload


def read(path, map_location: Any = "cpu", *, trusted: bool = False) -> Dict[str, Any]:
    """The verified payload of a checkpoint file ({"states", "extra", "rng"}); raises
    CheckpointError for a missing, truncated, corrupted or foreign file, or for one holding
    objects that ``torch.load(weights_only=True)`` refuses (unless ``trusted=True``: that runs
    code the file carries, so only for files you made)."""
    path = _check_path(path, "read")
    _check_flag(trusted, "trusted", "read")
    return _unpickle(_verified_body(path, "read"), path, map_location, trusted)


def _shape(v) -> Optional[Tuple[int, ...]]:
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _check_module(name: str, module: torch.nn.Module, state, strict: bool, path) -> None:
    """What module.load_state_dict(state, strict) checks (missing and unexpected keys, shapes),
    done before anything is copied, so that a mismatch changes no object at all."""
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{_NAME}.load: {path} holds a {type(state).__name__} for {name}, not a module state"
        )
    own = module.state_dict()
    errors: List[str] = []
    if strict:
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if missing:
            errors.append(f"missing keys {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            errors.append(
                f"unexpected keys {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
            )
    for k, v in own.items():
        if k in state and _shape(v) is not None and _shape(state[k]) is not None:
            if _shape(v) != _shape(state[k]):
                errors.append(
                    f"size mismatch for {k}: the file has {list(_shape(state[k]))}, "
                    f"{name} has {list(_shape(v))}"
                )
    if errors:
        raise CheckpointError(
            f"{_NAME}.load: {name} ({type(module).__name__}) does not match {path}: "
            + "; ".join(errors[:8])
            + ". Nothing was restored"
        )


def _snapshot(value):
    """A copy of a state_dict's containers, sharing its tensors (load_state_dict of a torch
    optimizer, scaler, scheduler or loader replaces them rather than writing into them)."""
    if isinstance(value, dict):
        return type(value)((k, _snapshot(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_snapshot(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_snapshot(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value
    return copy.copy(value)


def _restore(payload, path, objects: Dict[str, Any], rng: bool, strict: bool) -> dict:
    """Checks everything, then restores: objects other than modules first (each snapshotted and
    rolled back when a later one raises), the modules last (checked up front), then the RNG."""
    states = payload["states"]
    missing = [n for n, o in objects.items() if o is not None and n not in states]
    if missing:
        raise KeyError(
            f"{_NAME}.load: {path} holds no state for {', '.join(missing)} (it has "
            f"{', '.join(sorted(states)) or 'nothing'})"
        )
    targets = {n: o for n, o in objects.items() if o is not None}
    modules = {n: o for n, o in targets.items() if isinstance(o, torch.nn.Module)}
    others = {n: o for n, o in targets.items() if n not in modules}
    for n, m in modules.items():
        _check_module(n, m, states[n], strict, path)
    if rng and "rng" in payload:
        _check_rng_state(payload["rng"])
    done: List[Tuple[str, Any, Any]] = []
    try:
        for n, o in others.items():
            before = _snapshot(o.state_dict())
            o.load_state_dict(states[n])
            done.append((n, o, before))
    except BaseException:
        for n, o, before in reversed(done):
            try:
                o.load_state_dict(before)
            except Exception as e:  # noqa: BLE001 (report the first error; this one is worse)
                warnings.warn(
                    f"{_NAME}.load: could not roll {n} back after the error: {e}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        raise
    for n, m in modules.items():
        m.load_state_dict(states[n], strict=strict)
    if rng and "rng" in payload:
        set_rng_state(payload["rng"])
    return payload["extra"]


def _check_targets(objects: Dict[str, Any], who: str) -> None:
    for name, obj in objects.items():
        if obj is not None and not callable(getattr(obj, "load_state_dict", None)):
            raise TypeError(
                f"{_NAME}.{who}: {name} must have a load_state_dict() (a module, optimizer, "
                f"loader, GradScaler, scheduler...), got {type(obj).__name__}"
            )


def load(
    path,
    *,
    rng: bool = True,
    map_location: Any = "cpu",
    strict: bool = True,
    trusted: bool = False,
    **objects: Any,
) -> dict:
    """Verifies ``path``, then restores every object given from it (and the RNG states); returns
    the ``extra`` dict saved with it.

    Everything is checked before anything changes: every object named must be in the file
    (KeyError), every module's keys and shapes must match (CheckpointError), the RNG state must
    be valid; an object whose own ``load_state_dict`` still raises has the objects restored
    before it rolled back. ``trusted=True`` allows arbitrary pickled objects: it runs code the
    file carries, so use it only for files you made yourself."""
    path = _check_path(path, "load")
    for flag, name in ((rng, "rng"), (strict, "strict"), (trusted, "trusted")):
        _check_flag(flag, name, "load")
    _check_targets(objects, "load")
    payload = _unpickle(_verified_body(path, "load"), path, map_location, trusted)
    return _restore(payload, path, objects, rng, strict)


# ---- a folder of checkpoints --------------------------------------------------------------------


def _check_step(step, who: str) -> int:
    if isinstance(step, bool) or isinstance(step, float):
        raise TypeError(f"{_NAME}.CheckpointManager.{who}: step must be an int, got {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise TypeError(
            f"{_NAME}.CheckpointManager.{who}: step must be an int, got {step!r}"
        ) from None
    if value < 0:
        raise ValueError(f"{_NAME}.CheckpointManager.{who}: step must be >= 0, got {value}")
    return value


class CheckpointManager:
    """Numbered checkpoints ``<prefix>-<step>.pt`` in ``directory``, the newest ``keep`` kept.

    ``load_latest`` restores the newest file that verifies; a truncated or corrupted newest file
    is reported (a warning) and the one before it is used, so the previous checkpoint is never
    lost to a crash during a save. Temporary files a killed save left behind (on this machine)
    are removed by ``save`` and ``load_latest``."""

    def __init__(self, directory, keep: int = 2, prefix: str = "ckpt") -> None:
        directory = _check_path(directory, "CheckpointManager")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"{_NAME}.CheckpointManager: keep must be an int >= 1, got {keep!r}")
        if not isinstance(prefix, str):
            raise TypeError(
                f"{_NAME}.CheckpointManager: prefix must be a str, got {type(prefix).__name__}"
            )
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix) or prefix.startswith("."):
            raise ValueError(
                f"{_NAME}.CheckpointManager: prefix must be a plain file name part, got {prefix!r}"
            )
        if directory.exists() and not directory.is_dir():
            raise ValueError(
                f"{_NAME}.CheckpointManager: directory must be a folder, got {str(directory)!r}, "
                "which is a file"
            )
        self.directory = directory
        self.keep = keep
        self.prefix = prefix
        self._pattern = re.compile(rf"{re.escape(prefix)}-(\d+)\.pt")

    def _folder_exists(self, who: str) -> bool:
        if not self.directory.exists():
            return False
        if not self.directory.is_dir():
            raise CheckpointError(
                f"{_NAME}.CheckpointManager.{who}: {self.directory} is not a folder (a file took "
                "its place)"
            )
        return True

    def path(self, step: int) -> Path:
        return self.directory / f"{self.prefix}-{_check_step(step, 'path'):09d}.pt"

    def checkpoints(self) -> List[Path]:
        """The numbered files, oldest first."""
        if not self._folder_exists("checkpoints"):
            return []
        found = [
            (int(m.group(1)), p)
            for p in self.directory.iterdir()
            if (m := self._pattern.fullmatch(p.name))
        ]
        return [p for _, p in sorted(found)]

    def remove_stale_temps(self) -> List[str]:
        """Removes the temporary files of saves killed part-way (their process is gone)."""
        if not self._folder_exists("remove_stale_temps"):
            return []
        return remove_stale_temps(self.directory, [self._pattern.pattern])

    def save(self, step: int, extra: Optional[dict] = None, **objects: Any) -> Path:
        """Saves ``<prefix>-<step>.pt`` (extra["step"] = step), then removes the oldest files
        beyond ``keep``; the file just written is always kept."""
        step = _check_step(step, "save")
        if extra is not None and not isinstance(extra, Mapping):
            raise TypeError(
                f"{_NAME}.CheckpointManager.save: extra must be a dict or None, got "
                f"{type(extra).__name__}"
            )
        self._folder_exists("save")
        self.remove_stale_temps()
        path = save(self.path(step), extra={**(extra or {}), "step": step}, **objects)
        others = [p for p in self.checkpoints() if p != path]
        if others and self._step_of(others[-1]) > step:
            warnings.warn(
                f"{_NAME}.CheckpointManager.save: {others[-1].name} is newer than step {step}; "
                "load_latest() will pick it, not this one",
                RuntimeWarning,
                stacklevel=2,
            )
        for old in others[: max(0, len(others) - (self.keep - 1))]:
            old.unlink(missing_ok=True)
        return path

    def _step_of(self, p: Path) -> int:
        return int(self._pattern.fullmatch(p.name).group(1))

    def latest(self) -> Optional[Path]:
        """The newest checkpoint whose header and SHA-256 verify, or None."""
        for p in reversed(self.checkpoints()):
            try:
                _verified_body(p, "latest")
                return p
            except CheckpointError as e:
                warnings.warn(f"{e}; trying the previous checkpoint", RuntimeWarning, stacklevel=2)
        return None

    def load_latest(
        self,
        *,
        rng: bool = True,
        map_location: Any = "cpu",
        strict: bool = True,
        trusted: bool = False,
        **objects: Any,
    ) -> Optional[int]:
        """Restores the newest valid checkpoint into the objects (as :func:`load`); returns its
        step, or None when there is none (a fresh run). A folder that is a file is a
        CheckpointError, never a fresh run; so is a newest file that does not match the objects
        or that holds objects a weights_only load refuses (no fallback to an older one)."""
        for flag, name in ((rng, "rng"), (strict, "strict"), (trusted, "trusted")):
            _check_flag(flag, name, "CheckpointManager.load_latest")
        _check_targets(objects, "CheckpointManager.load_latest")
        self.remove_stale_temps()
        for p in reversed(self.checkpoints()):
            try:
                body = _verified_body(p, "load_latest")
            except CheckpointError as e:
                warnings.warn(f"{e}; trying the previous checkpoint", RuntimeWarning, stacklevel=2)
                continue
            payload = _unpickle(body, p, map_location, trusted)
            extra = _restore(payload, p, objects, rng, strict)
            step = extra.get("step")
            return step if type(step) is int else self._step_of(p)
        return None


# ---- early stopping -------------------------------------------------------------------------------

_ES = f"{_NAME}.EarlyStopping"


def _real(value, name: str, who: str) -> float:
    """A real number (a Python or numpy number, or a one-element tensor) as a float."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise TypeError(
                f"{who}: {name} must be a real number or a one-element tensor, got a tensor of "
                f"shape {tuple(value.shape)} and dtype {value.dtype}"
            )
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{who}: {name} must be a real number, got {value!r}")
    return float(value)


class EarlyStopping:
    """Stops when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` checks,
    keeping the best checkpoint (``best_path``) and saying why it stopped.

        stopper = EarlyStopping("val_loss", patience=3, best_path="runs/x/best.pt")
        for epoch in range(100):
            ...
            if stopper.step(val_loss, model=model, optimizer=opt):
                print(stopper.reason); break

    A NaN value never improves (it counts against the patience). When saving the best
    checkpoint fails, the error is raised and the stopper's state is left as it was.
    """

    _STATE_KEYS = ("best", "best_check", "checks", "bad_checks", "stopped", "reason")

    def __init__(
        self,
        monitor: str = "val_loss",
        patience: int = 3,
        min_delta: float = 0.0,
        mode: str = "min",
        best_path=None,
    ) -> None:
        if not isinstance(monitor, str):
            raise TypeError(f"{_ES}: monitor must be a str, got {type(monitor).__name__}")
        if not isinstance(mode, str):
            raise TypeError(f"{_ES}: mode must be 'min' or 'max', got {mode!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"{_ES}: mode must be 'min' or 'max', got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int):
            raise TypeError(f"{_ES}: patience must be an int >= 0, got {patience!r}")
        if patience < 0:
            raise ValueError(f"{_ES}: patience must be an int >= 0, got {patience!r}")
        min_delta = _real(min_delta, "min_delta", _ES)
        if not (min_delta >= 0 and min_delta != float("inf")):
            raise ValueError(f"{_ES}: min_delta must be finite and >= 0, got {min_delta!r}")
        self.monitor, self.patience, self.min_delta, self.mode = monitor, patience, min_delta, mode
        self.best_path = _check_path(best_path, "EarlyStopping") if best_path is not None else None
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
        value = _real(value, "value", f"{_ES}.step")
        improved = value == value and self._improved(value)  # NaN never improves
        if improved and self.best_path is not None and objects:
            # Saved first: when the save raises, nothing below has changed.
            save(
                self.best_path,
                extra={"monitor": self.monitor, "best": value, "check": self.checks},
                **objects,
            )
        if improved:
            self.best, self.best_check, self.bad_checks = value, self.checks, 0
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
        return {k: getattr(self, k) for k in self._STATE_KEYS}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state_dict`: exactly its keys, each checked before any is set
        (ValueError for a missing or unknown key or a bad value, TypeError for a bad type)."""
        who = f"{_ES}.load_state_dict"
        if not isinstance(state, Mapping):
            raise TypeError(f"{who}: state must be a dict (from state_dict()), got "
                            f"{type(state).__name__}")  # fmt: skip
        unknown = sorted(str(k) for k in state if k not in self._STATE_KEYS)
        missing = [k for k in self._STATE_KEYS if k not in state]
        if unknown or missing:
            raise ValueError(
                f"{who}: state must have exactly the keys {list(self._STATE_KEYS)}; "
                + (f"unknown {unknown}" if unknown else "")
                + ("; " if unknown and missing else "")
                + (f"missing {missing}" if missing else "")
            )
        best = state["best"]
        if best is not None:
            best = _real(best, "state['best']", who)
        ints = {}
        for key, low in (("best_check", -1), ("checks", 0), ("bad_checks", 0)):
            v = state[key]
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{who}: state[{key!r}] must be an int, got {v!r}")
            if v < low:
                raise ValueError(f"{who}: state[{key!r}] must be >= {low}, got {v}")
            ints[key] = v
        if not isinstance(state["stopped"], bool):
            raise TypeError(f"{who}: state['stopped'] must be a bool, got {state['stopped']!r}")
        if not isinstance(state["reason"], str):
            raise TypeError(f"{who}: state['reason'] must be a str, got {state['reason']!r}")
        consistent = (
            best is None and ints["best_check"] == -1
            if best is None or ints["best_check"] == -1
            else 0 <= ints["best_check"] < ints["checks"]
        ) and ints["bad_checks"] <= ints["checks"]
        if not consistent:
            raise ValueError(
                f"{who}: state is inconsistent: best={best!r} at check {ints['best_check']} "
                f"of {ints['checks']}"
            )
        self.best = best
        self.best_check, self.checks, self.bad_checks = (
            ints["best_check"],
            ints["checks"],
            ints["bad_checks"],
        )
        self.stopped, self.reason = state["stopped"], state["reason"]


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
