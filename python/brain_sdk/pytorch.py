"""PyTorch glue: the process group the SDK re-forms, DDP that follows it, a batch sampler.

* `TorchCollective` is the group `ElasticJob` steps with: torch.distributed's default group
  (the script's backend) plus, when that backend is not gloo, a gloo group for the SDK's
  one small all_gather per step (CPU tensors), and for the state one rank sends the others
  (`broadcast_bytes`, `broadcast_tensor`: rank 0's to the ranks a plan added, a holder's of
  the flash copy to restarted ranks whose node holds none). Re-forming destroys the groups
  and starts new ones at the new rank, size and store address.
* `ElasticDDP(job, model)` is DistributedDataParallel that is rebuilt on every rank right after
  the group re-forms (a DDP instance is tied to the group it was built in). Its gradient hook
  (DDP's own all-reduce) tells the job when this rank's backward pass handed over its last
  gradients: the end of its own work in the step, what straggler detection compares.
* `ElasticBatchSampler(job)` is a `torch.utils.data.Sampler` of index lists, for
  `DataLoader(dataset, batch_sampler=..., num_workers=0)`: each list is one step's `indices`.
"""

from datetime import timedelta
from typing import Any, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from .env import gloo_on_node_address
from .errors import BrainError


class TorchCollective:
    def __init__(self, backend: str = "gloo", timeout_s: float = 300.0):
        self.backend = backend
        self.timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size = 0, 1
        self._sdk_group = None

    def form(self, rank: int, world_size: int, addr: str, port: int) -> None:
        if not port:
            raise BrainError("MASTER_PORT is not set: the agent gives it to every process")
        # Ranks on other nodes reach this one at its node's address, not at what the host name
        # resolves to (127.0.0.1 in a container or a network namespace).
        try:
            gloo_on_node_address()
        except BrainError:
            pass  # not under an agent (a unit test): gloo's own choice
        dist.init_process_group(
            self.backend,
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world_size,
            timeout=self.timeout,
        )
        self._sdk_group = None if self.backend == "gloo" else dist.new_group(backend="gloo")
        self.rank, self.world_size = rank, world_size

    def all_gather(self, row: List[float]) -> List[List[float]]:
        t = torch.tensor(row, dtype=torch.float64)
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self._sdk_group)
        return [o.tolist() for o in out]

    def broadcast_bytes(self, data: Optional[bytes], src: int = 0) -> bytes:
        """Rank `src`'s `data` on every rank, over the SDK's gloo group (CPU tensors whatever
        the script's backend)."""
        sender = self.rank == src
        n = torch.tensor([len(data) if sender and data is not None else 0])
        dist.broadcast(n, src=src, group=self._sdk_group)
        if sender and data is None:
            raise BrainError(f"rank {src} sends the state: it has none to send")
        if int(n.item()) == 0:
            return b""
        # The tensor shares the bytearray's memory: what arrives is read back in one copy
        # (not byte by byte through the tensor's storage, which took minutes per GiB).
        got = bytearray(data) if sender else bytearray(int(n.item()))
        buf = torch.frombuffer(got, dtype=torch.uint8)
        dist.broadcast(buf, src=src, group=self._sdk_group)
        return data if sender else bytes(got)

    def broadcast_tensor(self, t: torch.Tensor, src: int = 0) -> None:
        """Rank `src`'s contiguous CPU tensor `t` into every rank's `t` (same shape and
        dtype), over the SDK's gloo group, as bytes (gloo takes every dtype that way)."""
        if t.numel():
            dist.broadcast(t.reshape(-1).view(torch.uint8), src=src, group=self._sdk_group)

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self._sdk_group = None


class ElasticDDP:
    """`DistributedDataParallel(model, **kwargs)`, rebuilt after each in-place re-formation.

    Call it like the model; `.module` is the model itself (its parameters are what the
    optimiser holds, unchanged across re-formations)."""

    def __init__(self, job: Any, model: torch.nn.Module, **ddp_kwargs: Any):
        self.module = model
        self._kwargs = ddp_kwargs
        self._job = job
        job.form_group()
        self.ddp = self._build()
        job.on_reform(self._rebuild)

    def _build(self) -> DistributedDataParallel:
        ddp = DistributedDataParallel(self.module, **self._kwargs)
        ddp.register_comm_hook(None, self._hook)
        return ddp

    def _hook(
        self, state: Any, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        # A bucket of gradients is ready: the last call of a step is where this rank's own
        # backward work ended. Then DDP's default all-reduce.
        mark = getattr(self._job, "mark_compute_done", None)
        if mark is not None:
            mark()
        return default_hooks.allreduce_hook(state, bucket)

    def _rebuild(self) -> None:
        # Built in the new group: DDP broadcasts rank 0's parameters, which every survivor
        # and every new rank (loaded from the cut checkpoint) already share.
        self.ddp = self._build()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp(*args, **kwargs)


class ElasticBatchSampler(torch.utils.data.Sampler):
    """Yields each step's `indices` for a DataLoader with `num_workers=0` (a loader that
    prefetches would end steps before they are trained). An index list is empty only when
    a step has fewer samples than there are ranks; give the DataLoader a `collate_fn` that
    accepts an empty list if your data can end that way."""

    def __init__(self, job: Any):
        self.job = job
        #: The step being trained (its `global_samples`, `loss_scale`, `epoch`).
        self.batch = None

    def __iter__(self) -> Iterator[List[int]]:
        for batch in self.job.batches():
            self.batch = batch
            yield batch.indices
