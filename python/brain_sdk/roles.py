"""Calls between the roles of one job: a process of one role calls a method of another role's
processes, over the job's own channels (its secret, and its TLS when the job runs with it).

    # in a reward engine (a `service` role named `reward`):
    class Reward:
        def score(self, episode):
            return float(sum(episode))
    brain_sdk.roles.serve(Reward())              # blocks; serves until the process is stopped

    # in any other process of the job (the trainer, a driver):
    reward = brain_sdk.roles.group("reward")
    reward.call("score", ep)                     # any one member, round robin
    reward.call("score", ep, how="round_robin")  # the same, by its other name
    reward.call("score", ep, how="rank0")        # the member of lowest index
    reward.call("score", ep, how="all")          # each member at once; results in index order

The callee group is read from the job master as it is now, and again after a failed call:
callers follow resizes and restarts. A call to a process that died is retried on its successor
(the same index, a new incarnation) or, for `any`, on another member, until `timeout`; then it
raises `BrainError` with the reason. Nothing waits without a deadline.

A call carries its chain of callers (`driver-0 → reward-1`). A call that would come back to a
process already waiting up its chain (`driver-0 → reward-1 → reward-1`) is a cycle that can
never be served once the callee's threads are all waiting: it is refused at once, naming the
chain, and reaches the caller as `BrainError`; so is a chain deeper than 32 calls.

The calls are counted: each process sends its job master, about once a second, the calls it made
to each role and the time it waited in them, and the calls it served and the time it spent
serving (`CallReport`). The master turns them into each role's rates (`job-master status`), and
the brain gives free capacity to the role its callers wait for.

Arguments and results travel pickled: only processes holding the job's secret (and its
certificate, with TLS) can call, as for every channel inside a job. A method whose name starts
with `_` cannot be called. An exception in the callee reaches the caller as `RemoteError`
(not retried: the callee ran).

A further all-reduce group (a role with `topology: allreduce` and a `command` of its own: a
critic trained by a group of its own beside the job's training group) forms with
`collective()`:

    # in each process of a role `critic: { topology: allreduce, replicas: 2, command: [...] }`
    g = brain_sdk.roles.collective()             # torch.distributed is initialised (gloo)
    step, state = g.restore() or (0, fresh())    # the group's newest committed checkpoint
    dist.all_reduce(t)                           # over the critic's ranks only
    g.checkpoint(step, state)                    # rank 0 writes it, the job master commits it

Its processes may serve calls too (`serve(obj, block=False)` before or after). A failed process
restarts the whole group (failover `role`), and a resize restarts it at its new size: each
process forms the group once, at its start, and restores the group's checkpoint (`restore()`),
which is the role group's own, apart from the training group's.
"""

import hmac
import itertools
import os
import pickle
import sys
import threading
import time
from concurrent import futures
from typing import Any, List, Optional

import grpc

from .checkpoint import read_verified, write_atomic
from .env import JOB_SERVER_NAME, ProcessEnv, gloo_on_node_address, read_job_tls
from .errors import BrainError, Refused
from .master import MasterClient, reserve_port

# The one method a role server answers: a pickled (method, args, kwargs) in, a pickled
# ("ok", result) or ("error", text) out.
_CALL = "/brain.roles.v1.Role/Call"
_HOWS = ("any", "round_robin", "rank0", "all")
# The metadata that carries a call's chain of callers ("driver-0,reward-1").
_CHAIN = "brain-call-chain"
_MAX_DEPTH = 32
# The chain of the call this thread is serving, if it serves one.
_serving = threading.local()


class _Tally:
    """This process's running totals of calls, sent to its job master by a daemon thread about
    once a second while they change. Reporting never fails a call: a
    master that cannot be reached is tried again at the next tick."""

    EVERY_S = 1.0

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = {}
        self.served = 0
        self.busy_s = 0.0
        self._sent = None
        self._thread = None
        self._env = None

    def called(self, env: ProcessEnv, role: str, waited_s: float) -> None:
        with self._lock:
            n, w = self.calls.get(role, (0, 0.0))
            self.calls[role] = (n + 1, w + waited_s)
            self._start(env)

    def serving(self, env: ProcessEnv, busy_s: float) -> None:
        with self._lock:
            self.served += 1
            self.busy_s += busy_s
            self._start(env)

    def _start(self, env: ProcessEnv) -> None:
        if self._thread is None:
            self._env = env
            self._thread = threading.Thread(target=self._run, name="brain-call-tally", daemon=True)
            self._thread.start()

    def _now(self):
        with self._lock:
            return (dict(self.calls), self.served, self.busy_s)

    def _run(self) -> None:
        master = None
        while True:
            time.sleep(self.EVERY_S)
            totals = self._now()
            if totals == self._sent:
                continue
            try:
                master = master or MasterClient(self._env)
                master.report_calls(*totals)
                self._sent = totals
            except BrainError:
                master = None  # tried again at the next tick


_tally = _Tally()


def _caller_chain(env: ProcessEnv) -> List[str]:
    """The chain a call made now carries: the one this thread serves, or this process."""
    return getattr(_serving, "chain", None) or [f"{env.role}-{env.index}"]


def refused_chain(chain: List[str], me: str) -> Optional[str]:
    """Why a call with callers `chain` cannot be served by `me`, if it cannot."""
    if me in chain:
        return (
            "a cycle of calls that can never be served: "
            + " → ".join(chain + [me])
            + f" ({me} is waiting for a call that comes back to it)"
        )
    if len(chain) >= _MAX_DEPTH:
        return f"calls nested more than {_MAX_DEPTH} deep: " + " → ".join(chain[:4] + ["…", me])
    return None


class RemoteError(BrainError):
    """The callee ran the method and it raised."""


class _Departed(BrainError):
    """A plan removed the member's index from its role."""


class _Unreachable(Exception):
    """A member did not answer (it died, or is not serving yet): worth a retry."""


def _identity(b: bytes) -> bytes:
    return b


def _tls(env: ProcessEnv):
    return read_job_tls(env.tls_dir) if env.tls_dir else None


class RoleServer:
    """Serves `obj`'s public methods to the job's other processes at this process's
    BRAIN_SERVICE_ADDR, and tells the job master so (the process becomes a member of its role
    group). `stop()` ends it."""

    def __init__(self, obj: Any, env: Optional[ProcessEnv] = None, workers: int = 8):
        self.env = env or ProcessEnv.from_env()
        if not self.env.service_addr:
            raise BrainError("BRAIN_SERVICE_ADDR is not set: run this as a Brain job's process")
        self._obj = obj
        self._token = self.env.token().encode()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        handler = grpc.unary_unary_rpc_method_handler(
            self._call, request_deserializer=_identity, response_serializer=_identity
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("brain.roles.v1.Role", {"Call": handler}),)
        )
        tls = _tls(self.env)
        if tls:
            ca, cert, key = tls
            creds = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=True
            )
            port = self._server.add_secure_port(self.env.service_addr, creds)
        else:
            port = self._server.add_insecure_port(self.env.service_addr)
        if port == 0:
            raise BrainError(f"cannot listen on {self.env.service_addr} to serve calls")
        self._server.start()
        self._master = MasterClient(self.env)
        self._master.serve_role(self.env.service_addr, _store_addr(self.env))

    def _call(self, request: bytes, context) -> bytes:
        metadata = dict(context.invocation_metadata())
        given = metadata.get("authorization", "")
        if not hmac.compare_digest(given.encode(), b"Bearer " + self._token):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the job's secret is required")
        chain = [c for c in metadata.get(_CHAIN, "").split(",") if c]
        me = f"{self.env.role}-{self.env.index}"
        why = refused_chain(chain, me)
        if why:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        try:
            method, args, kwargs = pickle.loads(request)
        except Exception as e:  # noqa: BLE001 - any malformed request is refused alike
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a call: {e}")
        if not isinstance(method, str) or method.startswith("_"):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method!r} cannot be called")
        fn = getattr(self._obj, method, None)
        if not callable(fn):
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{self.env.role} has no method {method!r}",
            )
        _serving.chain = chain + [me]
        started = time.monotonic()
        try:
            return pickle.dumps(("ok", fn(*args, **kwargs)))
        except Exception as e:  # noqa: BLE001 - the caller gets what the method raised
            return pickle.dumps(("error", f"{type(e).__name__}: {e}"))
        finally:
            _serving.chain = None
            _tally.serving(self.env, time.monotonic() - started)

    def wait(self) -> None:
        self._server.wait_for_termination()

    def stop(self, grace: float = 1.0) -> None:
        self._server.stop(grace)
        self._master.close()


def serve(obj: Any, block: bool = True, env: Optional[ProcessEnv] = None) -> RoleServer:
    """Serves `obj`'s methods to the job's other roles; with `block`, until the process ends."""
    server = RoleServer(obj, env)
    if block:
        server.wait()
    return server


class Group:
    """Another role of the job, as its callers see it: `call` reaches its members."""

    def __init__(
        self,
        role: str,
        env: Optional[ProcessEnv] = None,
        timeout: float = 30.0,
        refresh_every: float = 1.0,
    ):
        self.role = role
        self.timeout = timeout
        # The members are read again at most this often before a call (and after any failed
        # one), so that callers follow resizes.
        self.refresh_every = refresh_every
        self._refreshed = 0.0
        self.env = env or ProcessEnv.from_env()
        self._metadata = (("authorization", f"Bearer {self.env.token()}"),)
        self._tls = _tls(self.env)
        self._master = MasterClient(self.env)
        self._channels = {}
        self._lock = threading.Lock()
        self._next = itertools.count()
        self.members: List[Any] = []
        self.desired = 0
        self.refresh()

    def refresh(self) -> List[Any]:
        """Reads the group's serving members from the job master (index order)."""
        answer = self._master.role_group(self.role)
        self._refreshed = time.monotonic()
        self.members = list(answer.members)
        self.desired = answer.desired
        return self.members

    def _channel(self, address: str):
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                if self._tls:
                    ca, cert, key = self._tls
                    creds = grpc.ssl_channel_credentials(
                        root_certificates=ca, private_key=key, certificate_chain=cert
                    )
                    ch = grpc.secure_channel(
                        address,
                        creds,
                        options=(("grpc.ssl_target_name_override", JOB_SERVER_NAME),),
                    )
                else:
                    ch = grpc.insecure_channel(address)
                self._channels[address] = ch
            return ch

    def _one(self, member, payload: bytes, deadline: float):
        call = self._channel(member.address).unary_unary(
            _CALL, request_serializer=_identity, response_deserializer=_identity
        )
        try:
            answer = call(
                payload,
                timeout=max(0.05, deadline - time.monotonic()),
                metadata=self._metadata + ((_CHAIN, ",".join(_caller_chain(self.env))),),
                wait_for_ready=False,
            )
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise _Unreachable(f"{self.role}-{member.index}: {e.details()}") from None
            raise BrainError(
                f"{self.role}-{member.index} refused the call: {e.details()} ({e.code().name})"
            ) from None
        status, value = pickle.loads(answer)
        if status == "error":
            raise RemoteError(f"{self.role}-{member.index}: {value}")
        return value

    def _member(self, index: Optional[int], deadline: float, why: str):
        """A serving member (of `index`, or any in turn), waiting for one until `deadline`."""
        while True:
            members = self.members
            if index is not None:
                members = [m for m in members if m.index == index]
            if members:
                return members[next(self._next) % len(members)]
            if index is not None and index >= self.desired:
                raise _Departed(f"{self.role}-{index} left the role (resized to {self.desired})")
            if time.monotonic() >= deadline:
                which = f"{self.role}-{index}" if index is not None else f"any {self.role}"
                raise BrainError(f"no {which} serves within {self.timeout:.0f} s{why}")
            time.sleep(0.1)
            self.refresh()

    def _with_retry(self, index: Optional[int], payload: bytes, deadline: float):
        why = ""
        while True:
            member = self._member(index, deadline, why)
            try:
                return self._one(member, payload, deadline)
            except _Unreachable as e:
                why = f" (last: {e})"
                if time.monotonic() >= deadline:
                    raise BrainError(f"{e}; gave up after {self.timeout:.0f} s") from None
                time.sleep(0.1)
                self.refresh()

    def call(self, method: str, *args, how: str = "any", **kwargs):
        """Calls `method(*args, **kwargs)` on one member (`any` or `round_robin`: each in turn;
        `rank0`: the lowest index) or on each (`all`: every member at once, a list in index
        order; the first failure, by index, is raised once every call has ended)."""
        if how not in _HOWS:
            raise BrainError(f"how={how!r}: expected one of {', '.join(_HOWS)}")
        started = time.monotonic()
        try:
            return self._call(method, args, kwargs, how)
        finally:
            _tally.called(self.env, self.role, time.monotonic() - started)

    def _call(self, method: str, args, kwargs, how: str):
        payload = pickle.dumps((method, args, kwargs))
        if time.monotonic() - self._refreshed >= self.refresh_every:
            self.refresh()
        deadline = time.monotonic() + self.timeout
        if how in ("any", "round_robin"):
            return self._with_retry(None, payload, deadline)
        if not self.members:
            self._member(None, deadline, "")
        if how == "rank0":
            return self._with_retry(min(m.index for m in self.members), payload, deadline)
        # Each member at once, as a collective group's members must be (each waits in its
        # all-reduce for the others); the calls carry this thread's chain.
        indices = sorted({m.index for m in self.members})
        chain = getattr(_serving, "chain", None)
        gone = object()

        def each(index: int):
            _serving.chain = chain
            try:
                return self._with_retry(index, payload, deadline)
            except _Departed:
                return gone  # resized away meanwhile: not a member any more
            finally:
                _serving.chain = None

        with futures.ThreadPoolExecutor(max_workers=len(indices)) as pool:
            results = list(pool.map(each, indices))
        return [r for r in results if r is not gone]

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._master.close()


# Where this process's collective store would listen, once picked (a further all-reduce group's
# process gives the same address whether it serves calls, forms its group, or both).
_store = {}


def _store_addr(env: ProcessEnv) -> str:
    """This process's collective store address if it belongs to a further all-reduce group
    (picked once), else empty."""
    if env.topology != "allreduce" or not env.own_group:
        return ""
    key = (env.role, env.index, env.incarnation)
    if key not in _store:
        _store[key] = f"{env.host}:{reserve_port(env.host)}"
    return _store[key]


class Collective:
    """This process's place in its further all-reduce group, as `collective()` formed it."""

    def __init__(
        self,
        role: str,
        rank: int,
        world_size: int,
        store: str,
        members,
        env: Optional[ProcessEnv] = None,
    ):
        self.role = role
        self.rank = rank
        self.world_size = world_size
        # host:port of the store the group formed at (its lowest index's).
        self.store = store
        # [(index, incarnation)] of the members, in rank order.
        self.members = members
        self.env = env

    def _env(self) -> ProcessEnv:
        return self.env or ProcessEnv.from_env()

    def checkpoint(self, step: int, state: Any) -> Optional[str]:
        """Saves the group's state at `step`; every rank calls it. Rank 0 writes `state` (with
        `torch.save`, else pickle) atomically to a file of its own under
        `<checkpoint.dir>/roles/<role>/`, has the job master commit it (refused: `BrainError`,
        e.g. from a process the group restarted since, or for a step not after the one
        committed) and then removes the group's files the job master no longer keeps (it keeps
        the newest two: a restore falls back on the one before); with torch.distributed
        initialised, the other ranks wait at a barrier until it is committed. Returns the file
        on rank 0, None on the others."""
        env = self._env()
        path = None
        if self.rank == 0:
            directory = os.path.join(env.checkpoint_dir, "roles", self.role)
            # Its writer's index and incarnation in the name: a process the group restarted
            # since can never overwrite the committed file.
            prefix = f"step-{int(step):012d}"
            name = f"{prefix}-{env.index}.{env.incarnation}.pt"
            path = os.path.join(directory, name)
            digest = write_atomic(path, {"user": state, "brain_sdk": {"step": int(step)}})
            master = MasterClient(env)
            try:
                master.commit(int(step), path, digest)
            except Refused as e:
                # Refused outright: the file is no one's. Any other failure (the answer lost
                # on the way) may have committed it: it stays.
                if e.code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND"):
                    os.unlink(path)
                raise
            finally:
                master.close()
            try:
                kept = [p for _, p, _ in master_kept(env)]
            except BrainError:
                # Committed; which files the master keeps is not known now: the next
                # checkpoint removes what it no longer keeps.
                kept = None
            if kept is not None:
                remove_unkept(directory, [path] + kept)
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - no torch: no group to wait for
            return path
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        return path

    def restore(self, device: Any = None) -> "Optional[tuple[int, Any]]":
        """The group's newest committed checkpoint as (step, state), its SHA-256 checked and its
        tensors made on `device` (default the CPU); None when the group has committed none.
        Where the newest file is missing or damaged, the one committed before it is restored
        and stderr says so; `BrainError` when no file kept is whole."""
        return restore_kept(self.role, master_kept(self._env()), device)

    def __repr__(self) -> str:
        return (
            f"Collective({self.role}: rank {self.rank} of {self.world_size}, "
            f"store {self.store})"
        )


def master_kept(env: ProcessEnv) -> "List[tuple[int, str, str]]":
    """The checkpoints the job master keeps for `env`'s further all-reduce group, newest first."""
    master = MasterClient(env)
    try:
        return master.role_checkpoints()
    finally:
        master.close()


def restore_kept(role: str, kept: "List[tuple[int, str, str]]", device: Any = None):
    """The first of `kept` (step, file, SHA-256; newest first) whose file is there and whole,
    as (step, state); None when `kept` is empty. What was passed over is said on stderr;
    `BrainError` names each file when none is whole."""
    why = []
    for step, path, digest in kept:
        try:
            if not os.path.isfile(path):
                raise BrainError(f"checkpoint {path} is missing")
            state = read_verified(path, digest, device)["user"]
        except BrainError as e:
            why.append(f"step {step}: {e}")
            continue
        if why:
            print(
                f"brain_sdk: {role} restores step {step}, not its newest checkpoint: "
                + "; ".join(why),
                file=sys.stderr,
                flush=True,
            )
        return step, state
    if not kept:
        return None
    raise BrainError(f"{role} has no whole committed checkpoint: " + "; ".join(why))


def remove_unkept(directory: str, kept: "List[str]") -> None:
    """Removes the checkpoint files (`step-*`) in `directory` other than `kept`."""
    keep = {os.path.basename(p) for p in kept}
    for old in os.listdir(directory):
        if old.startswith("step-") and old not in keep:
            try:
                os.unlink(os.path.join(directory, old))
            except FileNotFoundError:
                pass


def collective(
    backend: str = "gloo",
    timeout: float = 300.0,
    init: bool = True,
    env: Optional[ProcessEnv] = None,
) -> Collective:
    """Forms this process's further all-reduce group (a role with `topology: allreduce` and a
    command of its own) and, with `init`, initialises torch.distributed over it with `backend`.

    The process tells its job master where its collective store would listen, then waits until
    the role's size of processes have (each its current incarnation): its rank is its place by
    index among them, the world size their number, and the group forms at the store of the
    lowest index. Raises `BrainError` from a process of another kind of role, and when the group
    has not formed within `timeout` seconds (with how many members were there)."""
    env = env or ProcessEnv.from_env()
    if env.topology != "allreduce" or not env.own_group or not env.service_addr:
        raise BrainError(
            f"{env.role} is not a further all-reduce group (a role with `topology: allreduce` "
            f"and a command of its own); its topology is {env.topology or 'unknown'}"
        )
    store = _store_addr(env)
    master = MasterClient(env)
    try:
        master.serve_role(env.service_addr, store)
        deadline = time.monotonic() + timeout
        while True:
            view = master.role_group(env.role)
            members = sorted(view.members, key=lambda m: m.index)
            me = [m for m in members if m.index == env.index]
            if me and me[0].incarnation != env.incarnation:
                raise BrainError(
                    f"{env.role}-{env.index} incarnation {env.incarnation} is stale: the group "
                    f"restarted (incarnation {me[0].incarnation} is current)"
                )
            if me and len(members) == view.desired and all(m.collective_addr for m in members):
                break
            if time.monotonic() > deadline:
                raise BrainError(
                    f"the all-reduce group {env.role} did not form within {timeout:.0f} s: "
                    f"{len(members)} of its {view.desired} processes are there"
                )
            time.sleep(0.2)
    finally:
        master.close()
    rank = [m.index for m in members].index(env.index)
    g = Collective(
        env.role,
        rank,
        len(members),
        members[0].collective_addr,
        [(m.index, m.incarnation) for m in members],
        env,
    )
    if init:
        import datetime

        import torch.distributed as dist

        if backend == "gloo":
            gloo_on_node_address(env)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{g.store}",
            rank=g.rank,
            world_size=g.world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
    return g


def group(role: str, timeout: float = 30.0, refresh_every: float = 1.0) -> Group:
    """The role `role` of this job, to call its members."""
    return Group(role, timeout=timeout, refresh_every=refresh_every)


def load_target(target: str):
    """The class `module:Class` or `path/to/file.py:Class` names."""
    import importlib
    import importlib.util
    import os

    module, _, name = target.rpartition(":")
    if not module or not name.isidentifier():
        raise BrainError(f"{target!r}: expected module:Class or path/to/file.py:Class")
    if module.endswith(".py"):
        if not os.path.isfile(module):
            raise BrainError(f"{target!r}: {module} is not a file")
        spec = importlib.util.spec_from_file_location(
            os.path.splitext(os.path.basename(module))[0], module
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(module)
    cls = getattr(mod, name, None)
    if cls is None:
        raise BrainError(f"{module} has no {name}")
    return cls


def _serve_named(target: str) -> None:
    """`python -m brain_sdk.roles TARGET`: serves an instance of the class TARGET names."""
    try:
        cls = load_target(target)
    except BrainError as e:
        raise SystemExit(str(e)) from None
    serve(cls())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m brain_sdk.roles module:Class | path/to/file.py:Class")
    _serve_named(sys.argv[1])
