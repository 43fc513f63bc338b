"""Flash checkpoints: a copy of the state in shared memory that the process's worker agent holds.

`ElasticJob.save_async` copies the state into memory (tmpfs) and returns; the agent writes the
copy to the checkpoint directory behind the training, with its SHA-256, and the job master
commits the checkpoint once every part of that step is written. The copy outlives the training
process (it belongs to the agent), so a process restarted on the same node restores from
memory when the copy is the newest committed checkpoint.

The agent gives each training process a directory on tmpfs (`BRAIN_FLASH_DIR`) and a budget in
bytes (`BRAIN_FLASH_BUDGET`) for two copies at most: `slot-0` and `slot-1`. A slot is one file,

    b"BRAINFL1" | meta length (u64, little-endian) | meta (pickle) | tensor bytes

each tensor's bytes starting on a 64-byte boundary, and beside it `slot-N.json`, its state,
replaced whole (write and rename):

    {"state": "writing" | "held" | "ready" | "persisting" | "persisted" | "committed" | "refused"
              | "kept",
     "save": n, "step": s,
     "rank": r, "world": w, "persist": true, "bytes": b, "digest": "...", "path": "..."}

("held": a consistent cut's copy the agent leaves alone until the job master knows of the cut.)

Whoever changes a slot holds an exclusive `flock` on its file: this process while it copies the
state in, the agent while it writes the copy out. The process never waits for the agent: a slot
being written out is left alone, and a copy still waiting to be written out is replaced by a
newer one (that older step is dropped whole, never mixed with the newer).
"""

import contextlib
import fcntl
import io
import json
import logging
import mmap
import os
import pickle
import struct
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import checkpoint as ckpt
from .errors import BrainError

try:  # PyTorch is optional: the SDK's core runs without it.
    import torch as _torch
except ImportError:  # pragma: no cover - depends on the environment
    _torch = None

MAGIC = b"BRAINFL1"
ALIGN = 64
SLOTS = 2
_HEAD = struct.Struct("<8sQ")
# How often a save that waits for a free slot looks again.
_WAIT_POLL_S = 0.005
log = logging.getLogger("brain_sdk")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


class _Ref:
    """A tensor in a snapshot: where its bytes are, and what they are."""

    __slots__ = ("offset", "nbytes", "dtype", "shape")

    def __init__(self, offset: int, nbytes: int, dtype: str, shape: Tuple[int, ...]):
        self.offset, self.nbytes, self.dtype, self.shape = offset, nbytes, dtype, shape


class _Pickler(pickle.Pickler):
    """Pickles the state's structure; its tensors become references to bytes after it."""

    def __init__(self, f):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: List[Any] = []
        self._seen: Dict[int, int] = {}

    def persistent_id(self, obj):
        if _torch is not None and isinstance(obj, _torch.Tensor):
            # The same tensor twice (tied weights) is one tensor after a restore too.
            i = self._seen.get(id(obj))
            if i is None:
                i = self._seen[id(obj)] = len(self.tensors)
                self.tensors.append(obj)
            return ("t", i)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, tensors: List[Any]):
        super().__init__(f)
        self._tensors = tensors

    def persistent_load(self, pid):
        kind, i = pid
        if kind != "t":  # pragma: no cover - only this module writes snapshots
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self._tensors[i]


def _dtype(name: str):
    return getattr(_torch, name.split(".", 1)[1])


def layout(state: Any, extra: Dict[str, Any]) -> Tuple[bytes, List[Any], List[int], int]:
    """The snapshot's meta (pickled), its tensors, each tensor's offset, and the file's size."""
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump(state)
    refs = []
    for t in p.tensors:
        refs.append((t.numel() * t.element_size(), str(t.dtype), tuple(t.shape)))
    meta = pickle.dumps(
        {"state": buf.getvalue(), "tensors": refs, **extra}, protocol=pickle.HIGHEST_PROTOCOL
    )
    offset = _align(_HEAD.size + len(meta))
    offsets = []
    for nbytes, _, _ in refs:
        offsets.append(offset)
        offset = _align(offset + nbytes)
    return meta, p.tensors, offsets, offset


def skeleton(state: Any) -> Tuple[bytes, List[Any]]:
    """`state` taken apart to be sent: its structure pickled with its tensors as references
    (each tensor once), and the tensors themselves, which travel apart as they are."""
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump(state)
    refs = [(t.numel() * t.element_size(), str(t.dtype), tuple(t.shape)) for t in p.tensors]
    head = pickle.dumps({"state": buf.getvalue(), "tensors": refs}, protocol=pickle.HIGHEST_PROTOCOL)
    return head, p.tensors


def empty_for(head: bytes) -> Tuple[Dict[str, Any], List[Any]]:
    """What `skeleton` sent as `head`, and an empty CPU tensor for each tensor to receive.
    Only for bytes of this job's own (a peer's): they may hold any Python value."""
    meta = pickle.loads(head)
    tensors = [_torch.empty(shape, dtype=_dtype(dtype)) for _, dtype, shape in meta["tensors"]]
    return meta, tensors


def scratch_for(head: bytes) -> List[Any]:
    """What `skeleton` sent as `head`, for a rank that takes part without keeping it: one
    byte buffer of the largest tensor's size, a view of it for each tensor to receive."""
    sizes = [nbytes for nbytes, _, _ in pickle.loads(head)["tensors"]]
    buf = _torch.empty(max(sizes, default=0), dtype=_torch.uint8)
    return [buf[:n] for n in sizes]


def rebuild(meta: Dict[str, Any], tensors: List[Any], device: Any = None) -> Any:
    """The state `skeleton` took apart, from its structure and its tensors (moved to `device`,
    as `torch.load`'s `map_location`, when one is given)."""
    if device is not None:
        tensors = [t.to(device) for t in tensors]
    return _Unpickler(io.BytesIO(meta["state"]), tensors).load()


def _copy_in(mm: mmap.mmap, tensor: Any, offset: int) -> None:
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return
    dst = _torch.frombuffer(mm, dtype=_torch.uint8, count=nbytes, offset=offset)
    src = tensor.detach()
    if not src.is_contiguous():
        src = src.contiguous()
    # A device tensor comes over in this one copy.
    dst.copy_(src.reshape(-1).view(_torch.uint8))


def read_state(path: str, device: Any = None) -> Tuple[Any, Dict[str, Any]]:
    """The state in snapshot file `path` (its tensors copied out of it: the slot may be written
    again later) and the snapshot's own fields.

    `device` (a torch device or its name, as `torch.load`'s `map_location`): where the tensors
    are made; each comes straight from the mapping in one copy. For a GPU the mapping is
    page-locked for the copies where the driver allows it (read-only host registration), so
    they run at the bus's speed; `fields["read_pinned"]` says whether it was."""
    if _torch is None:
        raise BrainError("a flash checkpoint holds torch tensors, and torch does not import")
    device = _torch.device(device if device is not None else "cpu")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _HEAD.size:
            raise BrainError(f"{path} is not a flash checkpoint: {size} bytes")
        # Read only, its pages mapped in one go (a fault per page would cost more than the
        # copy out).
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
    try:
        magic, meta_len = _HEAD.unpack_from(mm, 0)
        if magic != MAGIC or _HEAD.size + meta_len > size:
            raise BrainError(f"{path} is not a flash checkpoint (or is cut short)")
        meta = pickle.loads(mm[_HEAD.size : _HEAD.size + meta_len])
        offsets = _offsets(path, meta["tensors"], _align(_HEAD.size + meta_len), size)
        with warnings.catch_warnings():
            # Read only, and only read from: torch's warning is about writing.
            warnings.simplefilter("ignore", UserWarning)
            whole = _torch.frombuffer(mm, dtype=_torch.uint8)
        with _page_locked(whole, device) as pinned:
            tensors = [
                _tensor_of(whole, ref, offset, device, pinned)
                for ref, offset in zip(meta["tensors"], offsets)
            ]
        del whole
        state = _Unpickler(io.BytesIO(meta["state"]), tensors).load()
    finally:
        try:
            mm.close()
        except BufferError:
            # Something still exports its buffer: it is unmapped when that goes; an error
            # raised while copying is what the caller must see, not this.
            pass
    fields = {k: v for k, v in meta.items() if k not in ("state", "tensors")}
    fields["read_pinned"] = pinned
    return state, fields


def _offsets(path: str, refs: List[Any], offset: int, size: int) -> List[int]:
    """Where each tensor of snapshot `path` (`size` bytes) starts, from `offset` on; a tensor
    that would end past the file is refused before anything is copied."""
    offsets = []
    for nbytes, _, _ in refs:
        if offset + nbytes > size:
            raise BrainError(f"{path} is cut short: a tensor ends past {size} bytes")
        offsets.append(offset)
        offset = _align(offset + nbytes)
    return offsets


def _tensor_of(whole: Any, ref: Any, offset: int, device: Any, pinned: bool) -> Any:
    """The tensor `ref` (bytes, dtype, shape) at `offset` of a snapshot's bytes `whole`, made on
    `device` in one copy (queued, from page-locked memory)."""
    nbytes, dtype, shape = ref
    t = _torch.empty(shape, dtype=_dtype(dtype), device=device)
    if nbytes:
        t.reshape(-1).view(_torch.uint8).copy_(whole[offset : offset + nbytes], non_blocking=pinned)
    return t


@contextlib.contextmanager
def _page_locked(whole: Any, device: Any):
    """Registers the mapping `whole` with CUDA as page-locked, read-only host memory while the
    copies to `device` (a GPU) run: yields whether it is. Elsewhere, or where the driver
    refuses, it yields False and the copies go through the driver's staging buffers."""
    if device.type != "cuda" or whole.numel() == 0 or os.environ.get("BRAIN_FLASH_PIN") == "0":
        yield False
        return
    ptr, size = whole.data_ptr(), whole.numel()
    try:
        rt = _torch.cuda.cudart()
        # cudaHostRegisterPortable | cudaHostRegisterReadOnly: the mapping is read only.
        err = rt.cudaHostRegister(ptr, size, 0x1 | 0x8)
        locked = int(getattr(err, "value", err)) == 0
    except (AttributeError, RuntimeError, TypeError) as e:  # a torch without it
        log.debug("cannot page-lock the snapshot for its copies to %s: %s", device, e)
        locked = False
    if not locked:
        yield False
        return
    try:
        yield True
    finally:
        # The copies queued from it are done before it is unregistered (and unmapped).
        _torch.cuda.synchronize(device)
        rt.cudaHostUnregister(ptr)


def read_verified(path: str, digest: str, device: Any = None) -> Tuple[Any, Dict[str, Any]]:
    """`read_state` of a snapshot written out to disk, refused unless its SHA-256 is `digest`
    (as a restore from disk reads it: the file is checked, then read)."""
    ckpt.checked_digest(path, digest, "flash checkpoint")
    return read_state(path, device)


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, value: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


class FlashStore:
    """This process's two slots in its agent's shared memory."""

    def __init__(self, directory: str, budget: int):
        self.directory = directory
        self.budget = budget
        self._maps: Dict[int, Tuple[int, Optional[mmap.mmap], int]] = {}
        self._save = 0
        for s in range(SLOTS):
            st = self.status(s)
            if st:
                self._save = max(self._save, int(st.get("save", 0)))

    def slot_file(self, slot: int) -> str:
        return os.path.join(self.directory, f"slot-{slot}")

    def status(self, slot: int) -> Optional[Dict[str, Any]]:
        return _read_json(self.slot_file(slot) + ".json")

    def _fd(self, slot: int) -> int:
        held = self._maps.get(slot)
        if held:
            return held[0]
        fd = os.open(self.slot_file(slot), os.O_RDWR | os.O_CREAT, 0o600)
        self._maps[slot] = (fd, None, 0)
        return fd

    def _map(self, slot: int, size: int) -> mmap.mmap:
        """The slot's file mapped at `size` bytes, under its lock (kept mapped: its pages stay
        in place for the next save of the same size)."""
        fd, mm, held = self._maps[slot]
        if mm is not None and held == size:
            return mm
        if mm is not None:
            mm.close()
        os.ftruncate(fd, size)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(fd, size, flags=flags)
        self._maps[slot] = (fd, mm, size)
        return mm

    def _states(self) -> List[Dict[str, Any]]:
        return [self.status(s) or {} for s in range(SLOTS)]

    @staticmethod
    def _unsure(states: List[Dict[str, Any]]) -> bool:
        """Whether a shard's copy written out may be committed already: its agent hears of a
        sharded step's commit only at its next heartbeat, so the job master is asked before
        the slots are chosen."""
        return any(
            st.get("state") == "persisted" and int(st.get("world", 1)) > 1 for st in states
        )

    def _candidates(self, known: Optional[int] = None) -> List[int]:
        """The slots this save may take, best first. The newest copy the job master committed
        (else the newest written out, or kept) is never taken: it is what a restart on this
        node restores from; a copy written out of step `known` (the step the job master says
        is committed) counts as committed before its agent marks it. Of the others: a free or
        older one, then a copy still waiting to be written out (dropped for the newer), then
        one left "persisting" by an agent that died (its lock is free)."""
        states = self._states()
        save = lambda s: int(states[s].get("save", 0))  # noqa: E731
        committed = [
            s for s in range(SLOTS)
            if states[s].get("state") == "committed"
            or (states[s].get("state") == "persisted" and known is not None
                and int(states[s].get("step", -1)) == known)
        ]
        held = committed or [
            s for s in range(SLOTS) if states[s].get("state") in ("persisted", "kept")
        ]
        keep = max(held, key=save) if held else None

        def answer_due(s: int) -> bool:
            # A replicated copy written out after the committed one, the job master's answer
            # not yet back: it may be the step the master commits now. Left alone (the save
            # is skipped) until the agent marks it committed or refused.
            st = states[s]
            return (st.get("state") == "persisted" and int(st.get("world", 1)) == 1
                    and keep in committed and save(s) > save(keep))

        order = {None: 0, "persisted": 0, "kept": 0, "committed": 0, "refused": 0,
                 "writing": 0, "held": 1, "ready": 1, "persisting": 2}
        return sorted(
            (s for s in range(SLOTS) if s != keep and not answer_due(s)),
            key=lambda s: (order.get(states[s].get("state"), 0), save(s)),
        )

    def save(
        self,
        state: Any,
        *,
        step: int,
        rank: int,
        world: int,
        persist: bool,
        incarnation: int,
        sdk: Dict[str, Any],
        hold: bool = False,
        wait_s: float = 0.0,
        committed: Optional[Callable[[], Optional[int]]] = None,
    ) -> Dict[str, Any]:
        """Copies `state` into a slot and marks it ready for the agent; what was done. `world`
        is how many parts make the step (1: a replicated state, written out by rank 0 alone);
        a copy with `persist` false stays in memory only. With `hold`, the copy is `held`: the
        agent leaves it until `release(slot)` (a cut's copy, written out only once the job
        master knows the cut is held). With no slot free (the other being written out, or
        waiting for the job master's answer), the save is skipped, or with `wait_s` waits up to
        that long for one (`waited_s` in what was done). `committed()` gives the step the job
        master committed last (None: none, or not known); it is asked only where a shard's copy
        written out may be that step and its agent has not said so yet."""
        if _torch is None:
            raise BrainError("save_async copies torch tensors, and torch does not import")
        self._save += 1
        extra = {
            "step": step,
            "rank": rank,
            "world": world,
            "save": self._save,
            "incarnation": incarnation,
            "sdk": sdk,
        }
        meta, tensors, offsets, size = layout(state, extra)
        if 2 * size > self.budget:
            raise BrainError(
                f"the state is {gib(size)}, and the flash memory budget of {gib(self.budget)} "
                f"holds two copies of at most {gib(self.budget // 2)} each: raise "
                f"checkpoint.flash.memory, or save synchronously (job.checkpoint())"
            )
        began = time.monotonic()
        known: List[Optional[int]] = []  # asked at most once per save

        def ask() -> Optional[int]:
            if committed is None or not self._unsure(self._states()):
                return known[0] if known else None
            if not known:
                known.append(committed())
            return known[0]

        while True:
            done = self._try_save(extra, meta, tensors, offsets, size, hold, persist, ask)
            waited = time.monotonic() - began
            if not done["skipped"] or waited >= wait_s:
                done["waited_s"] = waited
                return done
            time.sleep(min(_WAIT_POLL_S, max(wait_s - waited, 0.0)))

    def _try_save(self, extra, meta, tensors, offsets, size, hold, persist, ask) -> Dict[str, Any]:
        """One try of `save`: the copy into the best free slot, or skipped. `ask()`: the step
        the job master committed, where it matters."""
        step = extra["step"]
        for slot in self._candidates(ask()):
            fd = self._fd(slot)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # the agent is writing it out: the other one
            try:
                # The states were read before the lock: an agent may have ended this slot's
                # write-out meanwhile (its answer now due, or the copy now the committed one).
                if slot not in self._candidates(ask()):
                    continue
                before = self.status(slot) or {}
                dropped = None
                if before.get("state") in ("held", "ready", "persisting"):
                    dropped = int(before.get("step", -1))
                status = self.slot_file(slot) + ".json"
                _write_json(status, {"state": "writing", **_public(extra)})
                mm = self._map(slot, size)
                _HEAD.pack_into(mm, 0, MAGIC, len(meta))
                mm[_HEAD.size : _HEAD.size + len(meta)] = meta
                for t, off in zip(tensors, offsets):
                    _copy_in(mm, t, off)
                _write_json(
                    status,
                    {"state": "held" if hold else "ready", "persist": persist, "bytes": size,
                     **_public(extra)},
                )
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return {"slot": slot, "bytes": size, "dropped": dropped, "skipped": False}
        # The other slot is being written out (or its answer is due) and this one holds the
        # committed copy: skipped (the next one goes ahead), or `save` tries again.
        return {"slot": None, "bytes": size, "dropped": step, "skipped": True}

    def release(self, slot: int) -> None:
        """A `held` copy becomes ready to be written out."""
        fd = self._fd(slot)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = self.status(slot) or {}
            if st.get("state") == "held":
                st["state"] = "ready"
                _write_json(self.slot_file(slot) + ".json", st)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def holding(self, step: int, digest: Optional[str]) -> Optional[str]:
        """The slot file that holds step `step` as committed, if this node has it: written out
        by its agent with `digest`, or kept in memory only (a replicated state that rank 0
        wrote out)."""
        for s in range(SLOTS):
            st = self.status(s) or {}
            if int(st.get("step", -1)) != step:
                continue
            if (st.get("state") == "kept" and digest is None) or (
                st.get("state") in ("persisted", "committed") and st.get("digest") == digest
            ):
                return self.slot_file(s)
        return None

    def close(self) -> None:
        for fd, mm, _ in self._maps.values():
            if mm is not None:
                mm.close()
            os.close(fd)
        self._maps.clear()


def _public(extra: Dict[str, Any]) -> Dict[str, Any]:
    return {k: extra[k] for k in ("step", "rank", "world", "save", "incarnation")}
