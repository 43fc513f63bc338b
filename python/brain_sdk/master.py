"""The training process's calls to its job master (gRPC, stubs generated from proto/)."""

import socket
import time
from typing import List, Optional

import grpc

from ._gen import jobmaster_pb2 as pb
from ._gen import jobmaster_pb2_grpc as pb_grpc
from .env import JOB_SERVER_NAME, ProcessEnv, read_job_tls
from .errors import BrainError, Refused

# Every call but the rendezvous poll answers at once; this bounds a job master that hangs.
CALL_TIMEOUT_S = 30.0


def reserve_port(host: str = "127.0.0.1") -> int:
    """A free port for the next process group's store (as torchrun picks MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def open_channel(master: str, tls_dir: str) -> grpc.Channel:
    """A channel to the job master at `master` (`http://host:port`), over mutual TLS with the
    job's certificate when the job runs with TLS (`tls_dir`), ready or refused within
    CALL_TIMEOUT_S."""
    target = master.removeprefix("http://")
    if tls_dir:
        # The job runs with TLS: mutual TLS with the job's certificate, the master checked
        # under the job's name (whatever its address).
        ca, cert, key = read_job_tls(tls_dir)
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )
        channel = grpc.secure_channel(
            target, creds, options=(("grpc.ssl_target_name_override", JOB_SERVER_NAME),)
        )
    else:
        channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=CALL_TIMEOUT_S)
    except grpc.FutureTimeoutError:
        channel.close()
        raise BrainError(
            f"the job master at {master} did not answer within {CALL_TIMEOUT_S:.0f} s"
        ) from None
    return channel


class MasterClient:
    def __init__(self, env: ProcessEnv):
        # The job's secret first: a process without it learns why before it waits on anything.
        self._metadata = (("authorization", f"Bearer {env.token()}"),)
        self._channel = open_channel(env.master, env.tls_dir)
        self._stub = pb_grpc.JobMasterStub(self._channel)
        # The role group by name, as the job master launched this process.
        self.me = pb.ProcessRef(role=env.role, index=env.index, incarnation=env.incarnation)

    def _call(self, name: str, request):
        try:
            return getattr(self._stub, name)(
                request, timeout=CALL_TIMEOUT_S, metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise Refused(name, e.code().name, e.details() or "") from None

    def lease(self, round_: int) -> "pb.LeaseShardResponse":
        return self._call("LeaseShard", pb.LeaseShardRequest(process=self.me, round=round_))

    def done(self, shard: "pb.Shard") -> None:
        self._call(
            "ReportShardDone",
            pb.ShardDone(
                process=self.me,
                shard_id=shard.id,
                epoch=shard.epoch,
                samples=shard.end - shard.start,
            ),
        )

    def metrics(self, m: "pb.TrainingMetrics") -> None:
        m.process.CopyFrom(self.me)
        self._call("ReportMetrics", m)

    def commit(self, step: int, path: str, digest: str) -> None:
        self._call(
            "CommitCheckpoint",
            pb.CheckpointCommit(process=self.me, step=step, path=path, digest=digest),
        )

    def cut_in_memory(self, step: int) -> None:
        """The consistent cut at `step` is held in the agents' shared memory (rank 0 says so):
        the job master ends the cut, and commits the step once its agent wrote it out."""
        self._call(
            "CommitCheckpoint",
            pb.CheckpointCommit(process=self.me, step=step, in_memory=True),
        )

    def committed_step(self) -> Optional[int]:
        """The step of the job's newest committed checkpoint (None: none yet)."""
        r = self._call("GetCommittedStep", self.me)
        return r.step if r.HasField("step") else None

    def checkpoint_damaged(self, manifest: str, problem: str) -> Optional[int]:
        """The checkpoint this process was told to resume from is damaged: the job master drops
        it and restarts the group from an older one it keeps (its step; this process is then
        stopped), or fails the job where it keeps none (None)."""
        r = self._call(
            "ReportCheckpointDamaged",
            pb.CheckpointDamaged(process=self.me, manifest=manifest, problem=problem),
        )
        return r.step if r.HasField("step") else None

    def role_checkpoints(self) -> "List[tuple[int, str, str]]":
        """The checkpoints this process's further all-reduce group keeps, newest first (two at
        most): (step, file, SHA-256) each; empty: none committed yet."""
        r = self._call("GetCommittedStep", self.me)
        kept = []
        if r.HasField("step") and r.path:
            kept.append((r.step, r.path, r.digest))
        if r.HasField("previous_step") and r.previous_path:
            kept.append((r.previous_step, r.previous_path, r.previous_digest))
        return kept

    def rejoin(self, service_addr: str) -> Optional["pb.JoinRendezvousResponse"]:
        """Joins the rendezvous again, serving the new group's store at `service_addr` if this
        process becomes rank 0, and waits until the round forms. None: a plan removed it."""
        while True:
            r = self._call(
                "JoinRendezvous",
                pb.JoinRendezvousRequest(process=self.me, service_addr=service_addr),
            )
            if r.removed:
                return None
            if r.ready:
                return r
            time.sleep(0.01)

    def serve_role(self, address: str, collective_addr: str = "") -> None:
        """This process serves calls from the job's other roles at `address`; a process of a
        further all-reduce group also gives where its collective store would listen."""
        self._call(
            "ServeRole",
            pb.ServeRoleRequest(
                process=self.me, address=address, collective_addr=collective_addr
            ),
        )

    def role_group(self, role: str) -> "pb.RoleGroupResponse":
        """The serving members of `role` as they are now."""
        return self._call("GetRoleGroup", pb.RoleGroupRequest(role=role))

    def report_calls(self, calls, served: int, busy_s: float) -> None:
        """This process's running totals of calls between roles: `calls` maps a role called to
        (calls, seconds waited); `served`/`busy_s` what it served."""
        self._call(
            "ReportCalls",
            pb.CallReport(
                process=self.me,
                calls=[
                    pb.CallsTo(role=r, calls=n, waited_s=w) for r, (n, w) in sorted(calls.items())
                ],
                served=served,
                busy_s=busy_s,
            ),
        )

    def close(self) -> None:
        self._channel.close()
