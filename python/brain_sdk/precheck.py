"""The pre-run check's process: the job master runs one on each node the job may use, before
training (the spec's `precheck:`), and meets them on its check server.

    python -m brain_sdk.precheck --master http://HOST:PORT --check ID --node I \\
        --matmul-size 1024 --allreduce-mb 16 --step-timeout-s 120

Step 0 times a square matmul on the node's device (CUDA when it has one, the CPU otherwise)
and reports it with the address of a rendezvous store this process serves. Each later step is
an all-reduce round the job master assigns: a group of two (or the node sits out), on rank 0's
store, NCCL between CUDA nodes and gloo otherwise, timed. The job master decides from the
figures which nodes are faulty or slow; this process only measures, and exits 0 when told the
check is done (a failed matmul or round is a result, not an error of the process). The job's
secret comes from BRAIN_JOB_TOKEN_FILE and its TLS directory from BRAIN_JOB_TLS_DIR, as for
training processes.
"""

import argparse
import datetime
import os
import socket
import sys
import time
from typing import Optional

import grpc

from ._gen import jobmaster_pb2 as pb
from ._gen import jobmaster_pb2_grpc as pb_grpc
from .env import node_interface, read_secret
from .errors import Refused
from .master import open_channel

# How many timed repetitions each measurement takes (after one untimed warm-up)...
REPEATS = 3
# ...and, for the matmul, how long it is timed at least: a short burst fits inside a CPU
# quota's period (a node capped at a quarter of a CPU runs 25 ms of each 100 ms at full
# speed), so only a longer run shows what the node sustains.
MATMUL_MIN_S = 0.5


def node_address(master: str) -> str:
    """The address this node reaches the job master from: where its peers reach it too."""
    host = master.removeprefix("http://").rsplit(":", 1)[0].strip("[]")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def time_matmul(torch, size: int, device: str) -> float:
    """Milliseconds per `size`² matmul: the mean over at least REPEATS of them and at least
    MATMUL_MIN_S, after a warm-up."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    (a @ b).sum().item()
    start = time.perf_counter()
    done = 0
    while done < REPEATS or time.perf_counter() - start < MATMUL_MIN_S:
        c = a @ b
        c.sum().item()  # waits for the device
        done += 1
    return (time.perf_counter() - start) * 1000.0 / done


def time_allreduce(torch, dist, step, own_store, megabytes: int, cuda: bool) -> float:
    """Milliseconds per all-reduce of `megabytes` in the group `step` assigns."""
    host, port = step.store.rsplit(":", 1)
    timeout = datetime.timedelta(seconds=step.timeout_s)
    if step.rank == 0:
        store = own_store
    else:
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
    group_store = dist.PrefixStore(f"round{step.step}", store)
    dist.init_process_group(
        step.backend, store=group_store, rank=step.rank, world_size=step.world, timeout=timeout
    )
    try:
        device = "cuda" if step.backend == "nccl" and cuda else "cpu"
        t = torch.ones(megabytes * (1 << 20) // 4, device=device)
        dist.all_reduce(t)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(REPEATS):
            dist.all_reduce(t)
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) * 1000.0 / REPEATS
        # Every member adds ones: a wrong sum is a broken link, not a slow one.
        want = float(step.world ** (REPEATS + 1))
        got = t[0].item()
        if got != want:
            raise RuntimeError(f"the all-reduce summed to {got}, not {want}")
        return elapsed
    finally:
        dist.destroy_process_group()


class CheckClient:
    """The check process's calls to the job master's check server."""

    def __init__(self, master: str, check: str, node: int, step_timeout_s: int):
        token = read_secret(os.environ.get("BRAIN_JOB_TOKEN_FILE", ""))
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._channel = open_channel(master, os.environ.get("BRAIN_JOB_TLS_DIR", ""))
        self._stub = pb_grpc.PreCheckStub(self._channel)
        self.check = check
        self.node = node
        # A step's answer comes within its timeout; beyond twice that the master is gone.
        self.wait_s = 2.0 * step_timeout_s + 30.0

    def step(self, step: int, ok: bool, millis: float = 0.0, error: str = "", **kw):
        report = pb.PreCheckReport(
            check=self.check, node=self.node, step=step, ok=ok, millis=millis, error=error, **kw
        )
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                # The answer waits for every node's report of this step, or about 20 s.
                answer = self._stub.Step(report, timeout=60.0, metadata=self._metadata)
            except grpc.RpcError as e:
                raise Refused("Step", e.code().name, e.details() or "") from None
            if not answer.again:
                return answer
            if time.monotonic() > deadline:
                raise Refused("Step", "DEADLINE_EXCEEDED", f"step {step} never ended")


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:2000]


def run(args) -> int:
    client = CheckClient(args.master, args.check, args.node, args.step_timeout_s)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        client.step(0, False, error=f"torch cannot be imported in {sys.executable}: {e}")
        return 1
    cuda = torch.cuda.is_available()
    address = node_address(args.master)
    # gloo (and NCCL's bootstrap) bind where the host name resolves, often 127.0.0.1 in a
    # container or network namespace: the interface of the node's address instead.
    interface = node_interface(address)
    if interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    own_store = dist.TCPStore(
        address, 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )
    store = f"{address}:{own_store.port}"
    try:
        millis = time_matmul(torch, args.matmul_size, "cuda" if cuda else "cpu")
        step = client.step(0, True, millis, store=store, cuda=cuda)
    except Refused:
        raise
    except Exception as e:  # noqa: BLE001 - a failed matmul is the node's result
        step = client.step(0, False, error=_error(e), store=store, cuda=cuda)
    while not step.done:
        if step.world == 0:
            step = client.step(step.step, True)
            continue
        try:
            millis = time_allreduce(torch, dist, step, own_store, args.allreduce_mb, cuda)
            step = client.step(step.step, True, millis)
        except Exception as e:  # noqa: BLE001 - a failed round is the node's result
            step = client.step(step.step, False, error=_error(e))
    return 0


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m brain_sdk.precheck",
        description="One node's part of a job's pre-run check; the job master runs it.",
    )
    parser.add_argument("--master", required=True, help="the check server, http://HOST:PORT")
    parser.add_argument("--check", required=True, help="the check's id")
    parser.add_argument("--node", required=True, type=int, help="this node's place in the check")
    parser.add_argument("--matmul-size", type=int, default=1024)
    parser.add_argument("--allreduce-mb", type=int, default=16)
    parser.add_argument("--step-timeout-s", type=int, default=120)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except Refused as e:
        print(f"precheck: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
