"""`ElasticJob`: a training loop's side of the job master's protocol.

Each step, every rank of the group:

1. leases a shard from the job master when it holds none (the answer may instead say: wait, a
   checkpoint is due, the group re-forms, or the data is over);
2. offers the next samples of its shard (up to its share of the global batch) and its flags in
   one small `all_gather`, so every rank sees the same step;
3. when the step has samples, gets its even slice of them (`Batch.indices`), whichever ranks'
   shards they come from, and trains on it (the body of the `for` loop);
4. after the step, reports every shard whose last samples it applied as done.

When no rank has samples, the flags decide, the same on every rank: all at the end of the
data - the loop ends; all told to re-form - the process group is rebuilt in place at the new
size (survivors keep their pid and memory; new ranks load the checkpoint of the cut, or, when
the cut is held in flash memory, get its state from rank 0 over the new group: the group never
waits for a disk write, see `_state_from_rank0`); all told
a checkpoint is due - rank 0 saves the script's state at this drained step boundary and the job
master records it (with flash memory for the job, every rank copies it into its agent's memory
instead, and the agent writes rank 0's copy out behind the training: see `_cut`). A shard is therefore done only once the step that applied it is over, and
a checkpoint holds exactly the shards done before it: after a kill -9 the job master rolls the
ledger back to the checkpoint the new processes load, and every sample is trained once per
epoch. The SDK also counts the samples applied and the sum of their indices (kept in the
checkpoint), which the job's report compares with the data set.

For the job master's straggler and hang detection, each report also says how many steps the
rank trained and the seconds of its own work in them: the body of the loop, or, under
`ElasticDDP`, up to the moment its backward pass handed over its last gradients (the wait for
slower ranks is not its own). On SIGUSR1 the process writes every thread's stack to the file
its agent names (Python's faulthandler), which the agent reads when the group looks hung.
"""

import faulthandler
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from . import checkpoint as ckpt
from . import flash
from ._gen import jobmaster_pb2 as pb
from .env import ProcessEnv
from .errors import BrainError, CheckpointDamaged, Refused
from .master import MasterClient, reserve_port

log = logging.getLogger("brain_sdk")
#: How long rank 0 waits at a consistent cut for a free flash slot (the other still being
#: written out by its agent) before it saves the cut to disk itself. The group is paused at the
#: cut either way: what is left of a write-out is never longer than a whole write of its own.
CUT_WAIT_S = 300.0
#: How long a process that found its checkpoint damaged waits for the group's restart to stop
#: it, as the built-in workload does.
FALLBACK_WAIT_S = 120.0

# The stacks file stays open for faulthandler for the life of the process.
_stacks_file = None


def install_stack_dump(path: str) -> None:
    """On SIGUSR1, every thread's Python stack is appended to `path` (idempotent)."""
    global _stacks_file
    if _stacks_file is not None or not path:
        return
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        _stacks_file = open(path, "a")
    except OSError as e:
        log.warning("no stack dumps on SIGUSR1: %s: %s", path, e)
        return
    faulthandler.register(signal.SIGUSR1, file=_stacks_file, all_threads=True)


def local_batch(global_batch: int, world: int, rank: int) -> int:
    """This rank's share of the global batch: split evenly, the remainder to the lowest ranks."""
    world = max(world, 1)
    return global_batch // world + (1 if rank < global_batch % world else 0)


def index_sum(start: int, n: int) -> int:
    """Sum of the indices start, start+1, ..., start+n-1."""
    return start * n + n * (n - 1) // 2


def slice_of(ranges: Sequence[Tuple[int, int]], lo: int, hi: int) -> List[int]:
    """Indices lo..hi of the concatenation of `ranges` ((start, count) pairs)."""
    out: List[int] = []
    offset = 0
    for start, n in ranges:
        a, b = max(lo - offset, 0), min(hi - offset, n)
        if a < b:
            out.extend(range(start + a, start + b))
        offset += n
    return out


@dataclass(frozen=True)
class Batch:
    """One step's share of this rank."""

    #: Sample indices this rank trains on in this step. Empty only when the step has fewer
    #: samples than there are ranks: run the step anyway (DDP needs every rank's backward).
    indices: List[int]
    #: The step number once this step is applied (1 for the job's first).
    step: int
    epoch: int
    #: Samples in this step over all ranks.
    global_samples: int
    world_size: int

    @property
    def loss_scale(self) -> float:
        """Multiply a summed (reduction="sum") loss by this: DDP averages gradients over the
        ranks, so the result is the gradient of the mean loss over the step's samples, however
        unevenly they fell on the ranks."""
        return self.world_size / self.global_samples


class _Alone:
    """A ps job's worker steps on its own: there is no group to agree with."""

    rank, world_size = 0, 1

    def form(self, rank: int, world_size: int, addr: str, port: int) -> None:
        pass

    def all_gather(self, row: List[float]) -> List[List[float]]:
        return [row]

    def leave(self) -> None:
        pass


class ElasticJob:
    """The SDK's handle on the job: data, group, checkpoints and metrics.

    A process that a plan adds joins the group when this is constructed (its agent started it
    at once; the group trains on until it has joined): do the slow setup first (imports,
    building the model, loading data), then construct the job and `restore()`.

    `batch_size` is the global batch of one step (split over the ranks, whatever their
    number). `backend` is torch.distributed's ("gloo" on the CPU, "nccl" for CUDA tensors);
    `timeout_s` bounds every collective.
    """

    def __init__(
        self,
        batch_size: int,
        *,
        backend: str = "gloo",
        timeout_s: float = 300.0,
        report_every_s: float = 1.0,
        env: Optional[ProcessEnv] = None,
        collective: Any = None,
    ):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise BrainError(f"batch_size={batch_size!r}: give the global batch, a whole number >= 1")
        self.env = env or ProcessEnv.from_env()
        install_stack_dump(self.env.stacks_file)
        self.batch_size = batch_size
        self.rank, self.world_size, self.round = (
            self.env.rank,
            self.env.world_size,
            self.env.round,
        )
        self._store = (self.env.master_addr, self.env.master_port)
        self.resume_from = self.env.resume_from
        self.restart_count = self.env.restart_count
        # Every member of the round starts in it from `resume_from` (restore(peers=True)).
        self._together = self.env.restore_together
        # The step of a cut held in memory whose state rank 0 sends the round's ranks as the
        # group forms (0: none), and what a rank new to the group got (for `restore()`).
        self._peer_step = 0
        # (step, structure, tensors) of the cut rank 0 sent this process (flash.skeleton).
        self._peer_state: Optional[Tuple[int, dict, list]] = None
        if collective is not None:
            self._group = collective
        elif self.env.kind == "ps":
            self._group = _Alone()
        else:
            try:
                from .pytorch import TorchCollective
            except ImportError as e:
                raise BrainError(
                    f"an allreduce job's group is torch.distributed, and torch does not import "
                    f"({e}): pip install torch (or ./python[torch])"
                ) from None
            self._group = TorchCollective(backend=backend, timeout_s=timeout_s)
        self.master = MasterClient(self.env)
        if self.env.joins:
            # Started before its group formed (it imported its framework meanwhile): join now.
            log.debug("joining the rendezvous")
            r = self.master.rejoin(self.env.service_addr)
            if r is None:
                self._leave("removed by a scale plan before it joined")
            log.debug("round %d formed: rank %d of %d", r.round, r.rank, r.world_size)
            self._joined(r)
        self._formed = False
        self._iterating = False
        self._save: Optional[Callable[[], Any]] = None
        self._on_reform: List[Callable[[], None]] = []
        self._report_every_s = report_every_s
        #: Steps applied to the model, samples applied by all ranks and the sum of their
        #: indices: kept in every checkpoint, so they continue across restarts.
        self.step = 0
        self.applied_samples = 0
        self.applied_index_sum = 0
        #: Samples this process trained on.
        self.samples_total = 0
        #: Times the group re-formed in place inside this process.
        self.reforms = 0
        #: Wall-clock time (time.time()) the last step ended, None before the first.
        self.last_step_time: Optional[float] = None
        #: Set at the end of the data on the one rank the job master chose to evaluate.
        self.evaluator = False
        self._loss_ema: Optional[float] = None
        self._last_report: Optional[float] = None
        self._samples_at_report = 0
        self._since = time.monotonic()
        # Seconds of this rank's own work in its steps, and the counts at the last report.
        self._compute_s = 0.0
        self._compute_at_report = 0.0
        self._step_at_report = 0
        # Set by ElasticDDP's gradient hook: when this rank's backward handed over its last
        # gradients in the step under way.
        self._compute_mark: Optional[float] = None
        #: Where `restore()` read the state: "memory" (this node's flash copy), "disk",
        #: "peer" (rank 0's, sent over the group when a plan added this process), or None.
        self.restored_from: Optional[str] = None
        # (where from, step) of a restore not yet said in a metrics report: the job's events
        # show it.
        self._restore_to_say: Optional[Tuple[str, int]] = None
        #: The latest consistent cut this process took part in: `step`, `held` ("memory": a
        #: flash copy, written out behind the training; "disk": saved by rank 0 before the
        #: group went on) and `blocked_s` (the time it took this rank).
        self.last_cut: Optional[dict] = None
        self._flash: Optional[flash.FlashStore] = None
        # The checkpoint to resume from was found damaged: nothing this process holds is saved.
        self._damaged = False

    # -- state ---------------------------------------------------------------------------

    def save_with(self, state: Callable[[], Any]) -> None:
        """What a checkpoint holds: `state()` is called on rank 0 at each consistent cut (and
        by `checkpoint()`), and what it returns is what `restore()` gives a later process."""
        self._save = state

    def _joined(self, r: "pb.JoinRendezvousResponse") -> None:
        self.rank, self.world_size, self.round = r.rank, r.world_size, r.round
        self._store = (r.master_addr, r.master_port)
        self.resume_from = r.resume_from or None
        self.restart_count = r.restart_count
        self._peer_step = int(r.state_from_rank0)
        self._together = bool(r.restore_together)

    def restore(self, device: Any = None, peers: bool = False) -> Optional[Any]:
        """The state saved in the checkpoint this process resumes from (its SHA-256 checked),
        or None when it starts fresh. Restores the SDK's step and sample counters too.

        `device` (as `torch.load`'s `map_location`, e.g. "cuda:0"): where its tensors are
        made, each in one copy (default: the CPU).

        A flash checkpoint (`save_async`) is read from this node's shared memory when its
        agent holds the committed copy (a process restarted here), else from disk;
        `self.restored_from` says which ("memory" or "disk"), and so does the log.

        `peers=True` (a replicated flash state; call it on every rank, as the group's first
        collective: it forms the group): where the job master says every member of the round
        starts in it from this checkpoint (a restart of the whole group), the ranks whose node
        holds the committed copy say so over the group, and the lowest of them sends it to
        the ranks whose node does not (a rank restarted on another node), which restore
        from that (`restored_from` "peer") rather than from disk. Otherwise as without it.

        A checkpoint found damaged (a file gone, cut short or not matching its digest; the
        manifest unreadable) is reported to the job master, which restarts the group from the
        newest checkpoint it keeps before it (this process is stopped and launched again) or,
        keeping none, fails the job; `restore()` then does not return."""
        try:
            return self._restore(device, peers)
        except CheckpointDamaged as e:
            self._fall_back(e)

    def _fall_back(self, damaged: CheckpointDamaged) -> None:
        """Tells the job master that the checkpoint to resume from is damaged, and waits to be
        stopped by the group's restart; raises `damaged` if that does not come."""
        # Whatever this process holds now is not the job's state: a save on SIGTERM must not
        # record it.
        self._damaged = True
        log.error("%s", damaged)
        try:
            step = self.master.checkpoint_damaged(self.resume_from or "", str(damaged))
        except Refused as e:
            if e.code != "FAILED_PRECONDITION":
                raise damaged from e
            # Another process of the group reported it first: the restart is under way.
            log.info("the group restarts already: %s", e.reason)
        else:
            if step is None:
                log.error("the job keeps no checkpoint older than %s: it fails", self.resume_from)
                raise damaged
            log.warning(
                "the job falls back to its checkpoint of step %d: waiting to be restarted", step
            )
        time.sleep(FALLBACK_WAIT_S)
        raise damaged

    def _restore(self, device: Any, peers: bool) -> Optional[Any]:
        if self._peer_step or self._peer_state is not None:
            # Added by a plan whose cut is held in memory: rank 0 sends its state as the
            # group forms.
            self.form_group()
            step, meta, tensors = self._peer_state
            self._peer_state = None
            blob = flash.rebuild(meta, tensors, device)
            self.restored_from = "peer"
            log.info("restored step %d from rank 0 over the group", step)
            return self._restored(blob)
        if not self.resume_from:
            return None
        kind, step, parts = ckpt.manifest_parts(self.resume_from)
        if kind == "flash" and peers and self._together and len(parts) == 1 and self.world_size > 1:
            return self._restore_flash_with_peers(step, parts[0], device)
        if kind == "flash":
            return self._restore_flash(step, parts, device)
        path, digest, _ = ckpt.manifest_model(self.resume_from)
        blob = ckpt.read_verified(path, digest, device)
        if not (isinstance(blob, dict) and "brain_sdk" in blob and "user" in blob):
            raise BrainError(f"checkpoint {path} was not written by brain_sdk")
        self.restored_from = "disk"
        return self._restored(blob)

    def _restored(self, blob: Any) -> Any:
        meta = blob["brain_sdk"]
        self.step = int(meta["step"])
        self._restore_to_say = (self.restored_from or "disk", self.step)
        # Steps restored are not steps this process timed.
        self._step_at_report = self.step
        self.applied_samples = int(meta["applied_samples"])
        self.applied_index_sum = int(meta["applied_index_sum"])
        return blob["user"]

    def _restore_flash(
        self, step: int, parts: List[Tuple[str, str]], device: Any = None
    ) -> Any:
        # One part: a replicated state (rank 0 wrote it out); else this rank's shard.
        if len(parts) == 1:
            path, digest = parts[0]
        elif self.rank < len(parts):
            path, digest = parts[self.rank]
        else:
            raise BrainError(
                f"flash checkpoint {self.resume_from} has {len(parts)} shards, and this is rank "
                f"{self.rank} of {self.world_size}: a sharded state restores at its own size"
            )
        # This rank's own part, as written out; or (replicated, another rank) the copy it kept
        # in memory at the committed step.
        mine = len(parts) > 1 or self.rank == 0
        held, read = self._read_held(step, digest if mine else None, device)
        if read is not None:
            state, fields = read
            self.restored_from = "memory"
        else:
            state, fields = flash.read_verified(path, digest, device)
            self.restored_from = "disk"
        log.info("restored step %d from %s (%s)", step, self.restored_from, held or path)
        return self._restored({"user": state, "brain_sdk": fields["sdk"]})

    def _read_held(
        self, step: int, digest: Optional[str], device: Any
    ) -> Tuple[Optional[str], Optional[Tuple[Any, Dict[str, Any]]]]:
        """This node's copy of step `step` (written out with `digest`, or, None, kept in memory
        only) and what it holds, (state, fields); (None, None) when this node has none that
        reads whole."""
        store = self._flash_store(required=False)
        held = store.holding(step, digest) if store is not None else None
        if held is None:
            return None, None
        try:
            return held, flash.read_state(held, device)
        except (OSError, BrainError) as e:
            # Gone from shared memory (removed by hand, the node's tmpfs cleaned) or cut
            # short: the copy written out is the same step.
            log.warning(
                "the copy of step %d held in memory (%s) cannot be read (%s): restoring "
                "from disk", step, held, e,
            )
            return None, None

    def _restore_flash_with_peers(
        self, step: int, part: Tuple[str, str], device: Any = None
    ) -> Any:
        """`restore(peers=True)` of a replicated flash state in a round that restores together:
        the ranks holding the copy in memory send it to the others (see `restore`)."""
        path, digest = part
        held, read = self._read_held(step, digest if self.rank == 0 else None, device)
        self.form_group()
        have = [row[0] > 0 for row in self._group.all_gather([1.0 if read is not None else 0.0])]
        holders = [r for r, h in enumerate(have) if h]
        blob = None if read is None else {"user": read[0], "brain_sdk": read[1]["sdk"]}
        if holders and len(holders) < len(have):
            src = holders[0]
            began = time.perf_counter()
            meta, tensors = self._share_state(blob, src, keep=read is None)
            if read is None:
                blob = flash.rebuild(meta, tensors, device)
                self.restored_from = "peer"
                log.info("restored step %d from rank %d over the group in %.2f s (this node "
                         "holds no copy)", step, src, time.perf_counter() - began)
                return self._restored(blob)
        if blob is not None:
            self.restored_from = "memory"
        else:
            state, fields = flash.read_verified(path, digest, device)
            blob = {"user": state, "brain_sdk": fields["sdk"]}
            self.restored_from = "disk"
        log.info("restored step %d from %s (%s)", step, self.restored_from, held or path)
        return self._restored(blob)

    def _flash_store(self, required: bool = True) -> Optional[flash.FlashStore]:
        if self._flash is None and self.env.flash_dir and self.env.flash_budget > 0:
            self._flash = flash.FlashStore(self.env.flash_dir, self.env.flash_budget)
        if self._flash is None and required:
            raise BrainError(
                "flash checkpoints are off for this job: give it shared memory for them "
                "(checkpoint: {flash: {memory: 4Gi}} in its spec), or save with checkpoint()"
            )
        return self._flash

    def _committed_step(self) -> Optional[int]:
        """The job master's newest committed step, for the flash slots' choice; None when it
        cannot say (the slots then keep what their agent marked, as without asking)."""
        try:
            return self.master.committed_step()
        except BrainError as e:
            log.debug("flash: the committed step is not known: %s", e)
            return None

    def save_async(
        self, state: Any = None, *, sharded: bool = False, fallback: Optional[str] = None
    ) -> dict:
        """Saves a checkpoint of `state` (default: what `save_with` gives) the fast way: it is
        copied into shared memory that this process's worker agent holds, and training goes on
        at once; the agent writes the copy to the checkpoint directory behind it (with its
        SHA-256), and the job master commits the step once every part of it is written.

        `sharded=False` (a replicated state, as under DDP): every rank keeps its copy in memory
        (to restore from after a restart on its node) and rank 0's is written out.
        `sharded=True`: each rank's state is its own shard, every rank calls this at the same
        step, and the step is committed once every shard is written.

        A process holds at most two copies, and never gives up the newest committed one (a
        restart on this node restores from it; for a sharded step, the job master is asked
        when the agent has not heard of its commit yet): a save goes to the other slot, replacing a
        copy not yet written out (its step is dropped whole, never mixed); while that slot is
        being written out, the save is skipped (`skipped`), never waited for. A state over half the job's flash memory
        (`checkpoint.flash.memory`) is refused with the sizes, unless `fallback="sync"`, which
        saves it with `checkpoint()` instead.

        For a script that reads its own data (as `checkpoint()`): where the job master leases
        the data, its checkpoints are taken at its cuts, and `batches()` saves there this way
        by itself when the job has flash memory. Returns what was done: `slot`, `bytes`,
        `blocked_s` (the time training waited), `dropped` (a step replaced before it was
        written out, or this one when `skipped`), `skipped`."""
        if fallback not in (None, "sync"):
            raise BrainError(f"fallback={fallback!r}: None or 'sync'")
        if state is None:
            if self._save is None:
                raise BrainError("nothing to save: pass the state, or call job.save_with(fn)")
            state = self._save()
        started = time.perf_counter()
        try:
            store = self._flash_store()
            done = store.save(
                state,
                step=self.step,
                rank=self.rank,
                world=self.world_size if sharded else 1,
                persist=sharded or self.rank == 0,
                incarnation=self.env.incarnation,
                sdk=self._sdk_fields(),
                committed=self._committed_step if sharded else None,
            )
        except BrainError as e:
            if fallback != "sync" or "budget" not in str(e):
                raise
            log.warning("%s: saving synchronously instead", e)
            path = self.checkpoint()
            return {"slot": None, "bytes": os.path.getsize(path), "dropped": None,
                    "skipped": False, "blocked_s": time.perf_counter() - started, "sync": path}
        done["blocked_s"] = time.perf_counter() - started
        if done["skipped"]:
            log.info("flash: step %d skipped: the previous copy is still being written out", self.step)
        elif done["dropped"] is not None:
            log.info("flash: step %d replaced before it was written out", done["dropped"])
        return done

    def checkpoint(self) -> str:
        """Saves the state now and has the job master record it; returns the file's path.

        The SDK calls this itself at every consistent cut. Call it yourself only where the
        job master tracks no data for this job (the script reads its own), e.g. on SIGTERM:
        a checkpoint anywhere else would not match the shards done, and is refused."""
        if self._save is None:
            raise BrainError("nothing to save: call job.save_with(fn) before training")
        state = {"user": self._save(), "brain_sdk": self._sdk_fields()}
        directory = os.path.join(
            self.env.checkpoint_dir,
            f"sdk-r{self.round:04d}-s{self.step:08d}-i{self.env.incarnation}",
        )
        path = os.path.join(directory, "state.pt")
        digest = ckpt.write_atomic(path, state)
        self.master.commit(self.step, path, digest)
        return path

    def save_on_sigterm(self) -> None:
        """On SIGTERM (a plan or a restart of a job that rescales by restarting), rank 0 saves
        a checkpoint, which the job master records for the next launch to resume from, and
        every rank exits 0, within the grace period. For a script that reads its own data:
        where the job master leases the data, the checkpoints of its cuts are the ones that
        count, and SIGTERM ends the process as usual."""

        def handler(signum, frame):
            if self.rank == 0 and not self._damaged:
                path = self.checkpoint()
                log.info("SIGTERM: checkpoint %s saved and recorded", path)
            self.master.close()
            sys.exit(0)

        signal.signal(signal.SIGTERM, handler)

    # -- group -----------------------------------------------------------------------------

    def form_group(self) -> None:
        """Forms the process group at the rank and size the agent launched this process with
        (torch.distributed's default group). Call it before wrapping a model in DDP;
        `batches()` calls it too. Idempotent."""
        if not self._formed:
            self._group.form(self.rank, self.world_size, *self._store)
            self._formed = True
            if self._peer_step:
                self._state_from_rank0(survivor=False)

    def on_reform(self, fn: Callable[[], None]) -> None:
        """`fn()` runs on every rank right after the group re-formed in place (rebuild DDP
        there; `brain_sdk.pytorch.ElasticDDP` does it for you)."""
        self._on_reform.append(fn)

    def _reform(self) -> bool:
        """Leaves the group and joins the next round. False: a plan removed this process."""
        log.debug("re-forming: leaving the group of %d", self.world_size)
        self._group.leave()
        self._formed = False
        # A fresh port for the next group's store, in case this process becomes its rank 0.
        addr = f"{self.env.host}:{reserve_port(self.env.host)}"
        r = self.master.rejoin(addr)
        if r is None:
            return False
        log.debug("round %d formed: rank %d of %d", r.round, r.rank, r.world_size)
        self._joined(r)
        self._group.form(r.rank, r.world_size, r.master_addr, r.master_port)
        self._formed = True
        self.reforms += 1
        log.debug("process group formed")
        if self._peer_step:
            self._state_from_rank0(survivor=True)
        for fn in self._on_reform:
            fn()
        log.debug("re-formation callbacks done")
        # The job master times a rescale until every rank reports a step: report the next.
        self._last_report = None
        self._samples_at_report = self.samples_total
        self._step_at_report = self.step
        self._compute_at_report = self._compute_s
        self._since = time.monotonic()
        return True

    # -- metrics ---------------------------------------------------------------------------

    def report(self, loss: float) -> None:
        """The loss of the step just trained (a running mean goes to the job master)."""
        loss = float(loss)
        if loss == loss and loss not in (float("inf"), float("-inf")) and loss >= 0:
            self._loss_ema = loss if self._loss_ema is None else 0.95 * self._loss_ema + 0.05 * loss

    def _metrics(self) -> "pb.TrainingMetrics":
        now = time.monotonic()
        since = self._last_report if self._last_report is not None else self._since
        sps = (self.samples_total - self._samples_at_report) / max(now - since, 1e-3)
        steps = max(self.step - self._step_at_report, 0)
        compute = max(self._compute_s - self._compute_at_report, 0.0)
        self._last_report = now
        self._samples_at_report = self.samples_total
        self._step_at_report = self.step
        self._compute_at_report = self._compute_s
        restored_from, restored_step = self._restore_to_say or ("", 0)
        self._restore_to_say = None
        return pb.TrainingMetrics(
            global_step=self.step,
            samples_per_second=sps,
            loss=self._loss_ema or 0.0,
            samples_total=self.samples_total,
            applied_samples=self.applied_samples,
            applied_index_sum=self.applied_index_sum,
            steps=steps,
            compute_seconds=compute,
            restored_from=restored_from,
            restored_step=restored_step,
        )

    def mark_compute_done(self) -> None:
        """This rank's own work of the step ends now (what follows is waiting for the
        others). `ElasticDDP` calls it from its gradient hook; a script that averages its
        gradients itself may call it right before its collective."""
        self._compute_mark = time.monotonic()

    def _report_if_due(self) -> None:
        if self.step == 0:
            return
        if self._last_report is not None and time.monotonic() - self._last_report < self._report_every_s:
            return
        self.master.metrics(self._metrics())

    # -- the loop --------------------------------------------------------------------------

    def batches(self) -> Iterator[Batch]:
        """The steps of the job, until every shard of every epoch is done.

        The body of the `for` loop is one training step; asking for the next batch says it is
        over. A process a plan removes exits 0 here (SystemExit) at the step boundary where
        the group re-forms."""
        if self._iterating:
            raise BrainError("batches() runs once per process")
        if self._save is None and self.env.kind == "allreduce":
            raise BrainError("call job.save_with(fn) first: rank 0 saves at every consistent cut")
        self._iterating = True
        self.form_group()
        ended = False
        while True:  # one group
            share = local_batch(self.batch_size, self.world_size, self.rank)
            shard = None
            pos = 0
            while True:  # one step
                due = reform = False
                if shard is None:
                    # Ranks at the end of the data keep asking too: they take part in a
                    # checkpoint or a re-formation the others vote for.
                    lease = self.master.lease(self.round if self.env.kind == "allreduce" else 0)
                    if lease.status == pb.LEASE_STATUS_GRANTED:
                        shard, pos = lease.shard, lease.shard.start
                    elif lease.status == pb.LEASE_STATUS_END_OF_DATA:
                        ended = True
                        self.evaluator = lease.evaluate
                    elif lease.status == pb.LEASE_STATUS_REMOVED and self.env.kind == "ps":
                        self._leave("removed by a scale plan")
                    else:
                        due, reform = lease.checkpoint_due, lease.reform
                n = min(share, shard.end - pos) if shard is not None else 0
                # This rank's offer: start, samples, idle at the end of the data, checkpoint
                # due, re-form, epoch.
                row = [
                    float(pos if shard is not None else 0),
                    float(n),
                    float(ended and shard is None),
                    float(due),
                    float(reform),
                    float(shard.epoch if shard is not None else 0),
                ]
                rows = self._group.all_gather(row)
                if log.isEnabledFor(logging.DEBUG) and (due or reform):
                    log.debug("step row %s, all: %s", row, rows)
                world = len(rows)
                total = int(sum(r[1] for r in rows))
                if total > 0:
                    ranges = [(int(r[0]), int(r[1])) for r in rows if r[1] > 0]
                    mine = slice_of(
                        ranges, total * self._group.rank // world, total * (self._group.rank + 1) // world
                    )
                    began = time.monotonic()
                    self._compute_mark = None
                    yield Batch(
                        indices=mine,
                        step=self.step + 1,
                        epoch=int(max(r[5] for r in rows if r[1] > 0)),
                        global_samples=total,
                        world_size=world,
                    )
                    mark = self._compute_mark
                    ended_at = mark if mark is not None and mark >= began else time.monotonic()
                    self._compute_s += ended_at - began
                    # The step is over: it is applied on every rank.
                    self.step += 1
                    self.applied_samples += total
                    self.applied_index_sum += sum(index_sum(s, k) for s, k in ranges)
                    self.samples_total += len(mine)
                    self.last_step_time = time.time()
                if shard is not None:
                    pos += n
                    if pos >= shard.end:
                        self.master.done(shard)
                        shard = None
                self._report_if_due()
                if total > 0:
                    continue
                flags = [int(sum(r[i] for r in rows)) for i in (2, 3, 4)]
                if flags[0] == world:
                    self.master.metrics(self._metrics())
                    return
                if flags[2] == world:
                    log.debug("every rank is told to re-form")
                    if not self._reform():
                        self._leave("removed by a scale plan at the re-formation")
                    break
                if flags[1] == world:
                    self._cut()
                else:
                    time.sleep(0.005)

    def _cut(self) -> None:
        """A checkpoint is due at this drained step boundary (every rank here). With flash
        memory for the job (`checkpoint.flash.memory`), every rank copies the state into its
        agent's memory (a restart on its node restores from there) and rank 0 tells the job
        master: the cut ends without waiting for a disk, and rank 0's agent writes the copy
        out behind the training. Otherwise, or where the copy cannot be taken (over the
        budget, the master refusing, the other slot still being written out after `CUT_WAIT_S`:
        rank 0 waits for that write-out to end first), rank 0 saves it to disk and the master
        records it."""
        rank0 = self._group.rank == 0
        began = time.perf_counter()
        how = "disk"
        store = self._flash_store(required=False)
        if store is not None and self._cut_in_memory(store, rank0):
            how = "memory"
        elif rank0:
            self.checkpoint()
        self.last_cut = {"step": self.step, "held": how, "blocked_s": time.perf_counter() - began}
        log.debug("cut at step %d held in %s", self.step, how)

    def _cut_in_memory(self, store: "flash.FlashStore", rank0: bool) -> bool:
        try:
            done = store.save(
                self._save(),
                step=self.step,
                rank=0,
                world=1,
                persist=rank0,
                incarnation=self.env.incarnation,
                sdk=self._sdk_fields(),
                hold=rank0,
                # The group waits at the cut either way: for the previous copy's write-out to
                # end (at most what is left of it), rather than for a whole write of its own.
                wait_s=CUT_WAIT_S if rank0 else 0.0,
            )
        except BrainError as e:
            log.warning("cut at step %d: %s; saved to disk instead", self.step, e)
            return False
        if not rank0:
            return True
        if done["skipped"]:
            log.info("cut at step %d: the previous cut still being written out after %.0f s; "
                     "saved to disk instead", self.step, done["waited_s"])
            return False
        if done["waited_s"] > 0.01:
            log.info("cut at step %d: waited %.2f s for the previous copy's write-out",
                     self.step, done["waited_s"])
        try:
            self.master.cut_in_memory(self.step)
        except Refused as e:
            if e.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                raise
            log.warning("cut at step %d: %s; saved to disk instead", self.step, e)
            return False
        store.release(done["slot"])
        return True

    def _state_from_rank0(self, survivor: bool) -> None:
        """The group was formed after a cut held in memory that a plan grew it at: rank 0 (a
        survivor, holding the state of the cut: nothing was trained since) sends that state to
        every rank over the new group, and a rank the plan added keeps it for `restore()`
        rather than waiting for the copy to be written out and reading it from disk. Every
        rank of the round takes part (a collective); survivors drop what they get."""
        step, self._peer_step = self._peer_step, 0
        rank0 = self._group.rank == 0
        if rank0 and not survivor:
            raise BrainError(
                f"rank 0 of the round formed after the cut at step {step} is a new process: "
                "it holds no state to send"
            )
        blob = None
        if rank0:
            if self._save is None:
                raise BrainError("call job.save_with(fn) first: rank 0 sends the cut's state")
            blob = {"user": self._save(), "brain_sdk": self._sdk_fields()}
        began = time.perf_counter()
        meta, tensors = self._share_state(blob, 0)
        log.info(
            "cut at step %d: its state (%d tensors, %d bytes) %s rank 0 over the group in %.2f s",
            step, len(tensors), sum(t.numel() * t.element_size() for t in tensors),
            "sent by" if rank0 else "received from", time.perf_counter() - began,
        )
        if not survivor:
            self._peer_state = (step, meta, tensors)

    def _share_state(
        self, blob: Any, src: int, keep: bool = True
    ) -> Tuple[Optional[dict], List[Any]]:
        """Rank `src`'s `blob` sent to every rank of the group (a collective): its structure
        first (small), then each tensor as it is, nothing serialised or copied on the way but
        the structure (a GPU's tensors go through the CPU). (structure, tensors) as received,
        for `flash.rebuild`; (None, the tensors sent) on rank `src`; (None, views of one
        reused buffer) on a rank that does not `keep` it (it holds the state already)."""
        send = getattr(self._group, "broadcast_bytes", None)
        send_tensor = getattr(self._group, "broadcast_tensor", None)
        if send is None or send_tensor is None:
            raise BrainError(
                "this process's collective cannot send the state between ranks (it has no "
                "broadcast_bytes and broadcast_tensor)"
            )
        head, tensors = None, []
        if self._group.rank == src:
            head, tensors = flash.skeleton(blob)
            tensors = [t.detach().cpu().contiguous() for t in tensors]
        head = send(head, src=src)
        meta = None
        if self._group.rank != src:
            if keep:
                meta, tensors = flash.empty_for(head)
            else:
                tensors = flash.scratch_for(head)
        for t in tensors:
            send_tensor(t, src=src)
        return meta, tensors

    def _sdk_fields(self) -> dict:
        """The SDK's own counters a checkpoint keeps beside the script's state."""
        return {
            "step": self.step,
            "applied_samples": self.applied_samples,
            "applied_index_sum": self.applied_index_sum,
        }

    def _leave(self, why: str) -> None:
        self.master.close()
        print(f"[brain_sdk] {why}: exiting", flush=True)
        raise SystemExit(0)
