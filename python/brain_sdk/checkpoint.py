"""Checkpoint files: atomic writes, SHA-256 digests and the job master's manifests.

A checkpoint is one file holding `{"user": <the script's state>, "brain_sdk": <the SDK's
counters>}`, written with `torch.save` when PyTorch is importable (else `pickle`) to a temporary
name, flushed to disk and renamed: a reader sees the old file or the new one, never half of one.
The job master records it in a manifest (`manifest.json` beside it, with the file's SHA-256),
and a process launched later finds that manifest in `BRAIN_RESUME_FROM`.
"""

import hashlib
import json
import os
import pickle
from typing import Any, List, Optional, Tuple

from .errors import BrainError, CheckpointDamaged

try:  # PyTorch is optional: the SDK's core runs without it.
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checked_digest(path: str, digest: str, what: str = "checkpoint") -> None:
    """Refuses (`CheckpointDamaged`) a checkpoint file that is gone or whose SHA-256 is not
    `digest`."""
    try:
        got = sha256_of(path)
    except FileNotFoundError:
        raise CheckpointDamaged(f"{what} {path} is gone") from None
    if got != digest:
        raise CheckpointDamaged(
            f"{what} {path} is damaged: its SHA-256 is {got}, the manifest says {digest}"
        )


class _Hashing:
    """A file that hashes what is written to it: the digest without reading the file back."""

    def __init__(self, f):
        self.f = f
        self.sha = hashlib.sha256()

    def write(self, b) -> int:
        self.sha.update(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def write_atomic(path: str, state: Any) -> str:
    """Writes `state` to `path` atomically and returns the file's SHA-256 (hex)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            out = _Hashing(f)
            if _torch is not None:
                _torch.save(state, out)
            else:
                pickle.dump(state, out, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return out.sha.hexdigest()


def read_verified(path: str, digest: Optional[str], device: Any = None) -> Any:
    """Reads a checkpoint file, refusing one whose SHA-256 is not `digest`; its tensors are
    made on `device` (`torch.load`'s `map_location`; default the CPU)."""
    if digest is not None:
        checked_digest(path, digest)
    with open(path, "rb") as f:
        if _torch is not None:
            # The file is this job's own checkpoint (the digest was checked): it may hold
            # optimiser state and plain Python values, not only tensors.
            return _torch.load(f, map_location=device or "cpu", weights_only=False)
        return pickle.load(f)


def manifest_model(manifest_path: str) -> Tuple[str, str, int]:
    """The model file, its digest and the step a job master's manifest records."""
    try:
        with open(manifest_path, "rb") as f:
            m = json.load(f)
    except (FileNotFoundError, ValueError) as e:
        # Gone or not JSON: damaged. Unreadable here (a permission): not the checkpoint's fault.
        raise CheckpointDamaged(f"cannot read checkpoint manifest {manifest_path}: {e}") from None
    except OSError as e:
        raise BrainError(f"cannot read checkpoint manifest {manifest_path}: {e}") from None
    part = m.get("model")
    if not isinstance(part, dict) or "path" not in part or "digest" not in part:
        raise BrainError(
            f"checkpoint manifest {manifest_path} names no model file: it was not written "
            f"for a script (kind {m.get('kind')!r})"
        )
    return part["path"], part["digest"], int(m.get("step", 0))


def manifest_parts(manifest_path: str) -> Tuple[str, int, List[Tuple[str, str]]]:
    """A job master's manifest: its kind, its step, and its files with their digests: a
    flash checkpoint's parts by rank (`shards`, or the one `model` of a replicated state),
    another's model file."""
    try:
        with open(manifest_path, "rb") as f:
            m = json.load(f)
    except (FileNotFoundError, ValueError) as e:
        # Gone or not JSON: damaged. Unreadable here (a permission): not the checkpoint's fault.
        raise CheckpointDamaged(f"cannot read checkpoint manifest {manifest_path}: {e}") from None
    except OSError as e:
        raise BrainError(f"cannot read checkpoint manifest {manifest_path}: {e}") from None
    parts = [p for p in m.get("shards") or [] if isinstance(p, dict)]
    if not parts and isinstance(m.get("model"), dict):
        parts = [m["model"]]
    return (
        str(m.get("kind", "")),
        int(m.get("step", 0)),
        [(p["path"], p["digest"]) for p in parts if "path" in p and "digest" in p],
    )
