"""Who this training process is, from the environment its worker agent set."""

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import BrainError


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise BrainError(
            f"{name} is not set: run this script as a Brain job's workload.command "
            "(job-master run SPEC.yaml), whose worker agent sets it"
        )
    return value


def _int(env: Mapping[str, str], name: str, default: Optional[int] = None) -> int:
    raw = env.get(name, "")
    if raw == "" and default is not None:
        return default
    raw = raw or _required(env, name)
    try:
        return int(raw)
    except ValueError:
        raise BrainError(f"{name}={raw!r} is not a whole number") from None


_ROLE_NAME = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class ProcessEnv:
    """The process's identity and its first group, as its agent launched it."""

    master: str
    role: str
    index: int
    incarnation: int
    rank: int
    world_size: int
    service_addr: str
    master_addr: str
    master_port: int
    round: int
    checkpoint_dir: str
    resume_from: Optional[str]
    restart_count: int
    # "allreduce" (a torch.distributed group) or "ps" (independent workers beside PS).
    kind: str
    # The agent started this process before the rendezvous: it joins itself.
    joins: bool = False
    # The job's secret file (BRAIN_JOB_TOKEN_FILE): every call to the job master carries it.
    token_file: str = ""
    # The job's TLS directory (BRAIN_JOB_TLS_DIR) when the job runs with TLS: calls to the job
    # master then go over mutual TLS with the job's certificate.
    tls_dir: str = ""
    # The topology of its role: "allreduce" or "ps" (the training group), "service" or
    # "single" (a role of its own); empty from an agent that predates roles.
    topology: str = ""
    # Where the process writes its threads' stacks on SIGUSR1 (BRAIN_STACKS_FILE): its agent
    # asks for them when the job master finds the group hung.
    stacks_file: str = ""
    # The agent's shared memory for flash checkpoints (BRAIN_FLASH_DIR) and its budget in bytes
    # for two copies (BRAIN_FLASH_BUDGET); empty/0 when the job has none (checkpoint.flash).
    flash_dir: str = ""
    flash_budget: int = 0
    # The process runs its role's own program outside the training group (BRAIN_OWN_GROUP): a
    # service, a single process, or a further all-reduce group (topology "allreduce").
    own_group: bool = False
    # Every member of its round starts in it from `resume_from` (BRAIN_RESTORE_TOGETHER): they
    # may share the state as they restore (`restore(peers=True)`).
    restore_together: bool = False

    @property
    def host(self) -> str:
        """The address this process serves on (its agent's node)."""
        return self.service_addr.rsplit(":", 1)[0] or "127.0.0.1"

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "ProcessEnv":
        env = os.environ if env is None else env
        joins = env.get("BRAIN_PROCESS_JOINS") == "1"
        # A process outside the training group (a service or single role, a further all-reduce
        # group) has no rank from the master: a further group's comes from roles.collective().
        own_role = (
            env.get("BRAIN_TOPOLOGY") in ("service", "single") or env.get("BRAIN_OWN_GROUP") == "1"
        )
        role = _required(env, "BRAIN_ROLE")
        if not _ROLE_NAME.fullmatch(role):
            raise BrainError(
                f"BRAIN_ROLE={role!r} is not a role name (a DNS label starting with a letter)"
            )
        return cls(
            master=_required(env, "BRAIN_MASTER_ADDR"),
            role=role,
            index=_int(env, "BRAIN_INDEX"),
            incarnation=_int(env, "BRAIN_INCARNATION"),
            # A process that joins the rendezvous itself (BRAIN_PROCESS_JOINS) learns these
            # from the job master when it does.
            rank=_int(env, "RANK", 0 if joins or own_role else None),
            world_size=_int(env, "WORLD_SIZE", 0 if joins or own_role else None),
            service_addr=env.get("BRAIN_SERVICE_ADDR", ""),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1") or "127.0.0.1",
            master_port=_int(env, "MASTER_PORT", 0),
            round=_int(env, "BRAIN_RENDEZVOUS_ROUND", 0),
            checkpoint_dir=_required(env, "BRAIN_CHECKPOINT_DIR"),
            resume_from=env.get("BRAIN_RESUME_FROM") or None,
            restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            kind="ps" if env.get("BRAIN_PS_VERSION") else "allreduce",
            topology=env.get("BRAIN_TOPOLOGY", ""),
            joins=joins,
            token_file=env.get("BRAIN_JOB_TOKEN_FILE", ""),
            tls_dir=env.get("BRAIN_JOB_TLS_DIR", ""),
            stacks_file=env.get("BRAIN_STACKS_FILE", ""),
            flash_dir=env.get("BRAIN_FLASH_DIR", ""),
            own_group=env.get("BRAIN_OWN_GROUP") == "1",
            flash_budget=_int(env, "BRAIN_FLASH_BUDGET", 0),
            restore_together=env.get("BRAIN_RESTORE_TOGETHER") == "1",
        )

    def token(self) -> str:
        """The job's secret, read from the owner-only file the agent named."""
        return read_secret(self.token_file)


# The name every process of a job presents and checks, whatever its address (the Rust side's
# auth::tls::JOB_SERVER_NAME).
JOB_SERVER_NAME = "job.brain.internal"


def read_job_tls(tls_dir: str) -> "tuple[bytes, bytes, bytes]":
    """The job's CA, certificate and key (owner-only), as the job master wrote them."""
    out = []
    for name in ("ca.pem", "job.pem", "job.key"):
        path = os.path.join(tls_dir, name)
        try:
            mode = os.stat(path).st_mode
            with open(path, "rb") as f:
                out.append(f.read())
        except OSError as e:
            raise BrainError(f"the job's TLS file {path}: {e.strerror}") from None
        if name.endswith(".key") and mode & 0o077:
            raise BrainError(
                f"the job's TLS key {path}: readable by others (mode {mode & 0o777:o}): "
                f"chmod 600 {path}"
            )
    return out[0], out[1], out[2]


def read_secret(path: str) -> str:
    """A token file as the Rust side writes it: 64 hex digits, readable by its owner only."""
    if not path:
        raise BrainError(
            "BRAIN_JOB_TOKEN_FILE is not set: the job master refuses calls without the job's "
            "secret; run this script as a Brain job's workload.command, whose agent sets it"
        )
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError as e:
        raise BrainError(f"the job's secret {path}: {e.strerror}") from None
    if mode & 0o077:
        raise BrainError(
            f"the job's secret {path}: readable by others (mode {mode & 0o777:o}): "
            f"chmod 600 {path}"
        )
    if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise BrainError(f"the job's secret {path}: not a token (64 hex digits)")
    return text


def node_interface(ip: str) -> Optional[str]:
    """The name of this node's network interface that holds IPv4 address `ip` (the address
    the agent registered the process from), or None. torch's gloo binds to the address its
    host name resolves to, which inside a container or network namespace is often 127.0.0.1:
    set GLOO_SOCKET_IFNAME to this (as `gloo_on_node_address` does) so ranks on other nodes
    reach it."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return None


def gloo_on_node_address(env: Optional["ProcessEnv"] = None) -> Optional[str]:
    """Makes torch's gloo use the interface of this process's node address (unless
    GLOO_SOCKET_IFNAME is set already); returns the interface used."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    env = env or ProcessEnv.from_env()
    name = node_interface(env.host)
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name
    return name
