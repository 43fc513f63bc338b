"""Build a job of several roles in Python, as the YAML spec would write it.

    from brain_sdk import JobBuilder

    job = (
        JobBuilder("rl-ppo", kind="allreduce")
        .role("worker").run(["python3", "train.py"]).resource(cpu=2, memory="2Gi").total(2)
        .role("rollout").run("rl.rollout:Engine").total(2).min(2).max(4)
        .role("reward").run("rl.reward:Model").total(1)
        .env(OMP_NUM_THREADS="1")
        .data(num_samples=20_000, shard_size=500)
        .checkpoint("ckpt", every_shards=10)
    )
    job.dry_run()                      # prints the spec (JSON, which is YAML)
    job.submit(brain="http://127.0.0.1:50070")   # through the brain (brainctl submit)
    job.run()                          # or with a local job master (job-master run)

`build()` returns the spec as the dict a YAML spec parses to; the job master validates it (its
field paths name what is wrong). A role's program is an argv list, a shell-free string split
like a shell would, or `module:Class` / `path/to/file.py:Class`: the SDK then serves an
instance of that class to the job's other roles (`python -m brain_sdk.roles module:Class`, see
`roles`). The training roles run the job's workload: `worker` (and `ps` in a ps job), or in an
allreduce job the role given `.topology("allreduce")` (an `actor`, a `trainer`: the all-reduce
group named freely); give it with `.role("actor").topology("allreduce").run(...)` or
`.builtin(...)`, in any order. A further all-reduce group with a program of its own (a critic
trained by a group of its own, formed with `brain_sdk.roles.collective()`) is
`.role("critic").topology("allreduce", training=False).run([...])`.

Placement: `.colocate("actor", "critic")` keeps those roles' processes on one node
(`strict_pack`; `strict=False` for `pack`), `.spread("rollout")` puts them on different nodes
(`strict_spread`; `strict=False` for `spread`): each is a placement group, laid out whole before
its processes start, more laid out beside them as a role grows (docs/roles.md).

Not yet: fractional GPUs and device colocation; a fraction of a GPU is refused here with that
reason rather than rounded.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Union

from .errors import BrainError

Program = Union[str, Sequence[str]]


def _program(program: Program) -> List[str]:
    if isinstance(program, str):
        module, _, name = program.rpartition(":")
        if module and name.isidentifier() and " " not in program:
            # module:Class or path/to/file.py:Class: served to the other roles by the SDK.
            return [sys.executable, "-m", "brain_sdk.roles", program]
        return shlex.split(program)
    argv = [str(w) for w in program]
    if not argv:
        raise BrainError("run(): give the program and its arguments")
    return argv


class _Role:
    def __init__(self, name: str):
        self.name = name
        self.spec: Dict[str, Any] = {}
        # What it runs and its environment: the role's own, or, for the training roles, the
        # job's workload (decided at build(), when every role's topology is known).
        self.program: Optional[List[str]] = None
        self.env: Dict[str, str] = {}
        # `.topology("allreduce", training=False)`: a further all-reduce group, which runs
        # its own program rather than the workload.
        self.further = False


class JobBuilder:
    """A job spec, one role at a time. Methods after `.role(name)` set that role; the others
    set the job."""

    def __init__(self, name: str, kind: str = "allreduce"):
        if kind not in ("allreduce", "ps"):
            raise BrainError(f"kind {kind!r}: expected 'allreduce' or 'ps'")
        self._spec: Dict[str, Any] = {"name": name, "kind": kind, "roles": {}, "workload": {}}
        self._roles: Dict[str, _Role] = {}
        self._current: Optional[_Role] = None

    # --- roles ---------------------------------------------------------------------------

    def role(self, name: str) -> "JobBuilder":
        """Starts (or returns to) the role group `name`."""
        self._current = self._roles.setdefault(name, _Role(name))
        return self

    def _role(self, what: str) -> _Role:
        if self._current is None:
            raise BrainError(f"{what}(): call .role(name) first")
        return self._current

    def run(
        self,
        program: Optional[Program] = None,
        *,
        job_master: Optional[str] = None,
        args: Sequence[str] = (),
    ) -> Any:
        """With a program: the current role's program (argv, a command line, or
        `module:Class`, served to the other roles; for the training roles the job's workload
        command). Without: runs the job to its end with a local job master (`job-master run`,
        `args` after the spec), raising CalledProcessError if it did not succeed."""
        if program is None:
            exe = _binary("job-master", job_master)
            return self._with_file([exe, "run"], list(args), absolute=True, check=True)
        self._role("run").program = _program(program)
        return self

    def builtin(self, **settings: Any) -> "JobBuilder":
        """The training roles run the built-in workload (with these settings)."""
        self._spec["workload"]["builtin"] = dict(settings)
        return self

    def resource(
        self,
        cpu: Union[int, float, str, None] = None,
        memory: Union[int, str, None] = None,
        gpu: Union[int, float, None] = None,
        gpu_type: Optional[str] = None,
    ) -> "JobBuilder":
        """Resources of each process of the role: cores (2, 0.5, "500m"), memory (bytes or
        "2Gi"), GPUs (whole, or a share of one device such as 0.4) and their model."""
        r = self._role("resource")
        res = r.spec.setdefault("resources", {})
        if cpu is not None:
            res["cpu"] = cpu
        if memory is not None:
            res["memory"] = memory
        if gpu is not None:
            g = float(gpu)
            if g < 0 or (g > 1 and g != int(g)):
                raise BrainError(
                    f"gpu={gpu}: a share of one device (below 1) or whole GPUs"
                )
            res["gpu"] = int(g) if g == int(g) else g
        if gpu_type is not None:
            res["gpu_type"] = gpu_type
        return self

    def total(self, n: int) -> "JobBuilder":
        """Processes the role starts with (`replicas`)."""
        self._role("total").spec["replicas"] = n
        return self

    def per_group(self, k: int) -> "JobBuilder":
        """The role grows and shrinks in multiples of `k` (`node_unit`)."""
        self._role("per_group").spec["node_unit"] = k
        return self

    def min(self, n: int) -> "JobBuilder":
        self._role("min").spec["min"] = n
        return self

    def max(self, n: int) -> "JobBuilder":
        self._role("max").spec["max"] = n
        return self

    def topology(self, topology: str, training: bool = True) -> "JobBuilder":
        """`service` (independent replicas; the default for roles other than worker and ps),
        `single` (one process), or `allreduce`: this role is the job's all-reduce training
        group, in place of `worker`; with `training=False`, a further all-reduce group that
        runs its own program (`.run(...)`) beside the training group."""
        r = self._role("topology")
        if not training and topology != "allreduce":
            raise BrainError(
                f"role {r.name}: training=False is for a further all-reduce group; a "
                f"{topology} role is never the training group"
            )
        r.spec["topology"] = topology
        r.further = not training
        return self

    def failover(self, level: str) -> "JobBuilder":
        """What restarts when one of the role's processes fails: `process`, `role` or `job`."""
        self._role("failover").spec["failover"] = level
        return self

    def max_restarts(self, n: int) -> "JobBuilder":
        self._role("max_restarts").spec["max_restarts"] = n
        return self

    def env(self, **variables: str) -> "JobBuilder":
        """Extra environment: of the current role's processes, or of the training processes
        (before any `.role`, or on a training role)."""
        r = self._current
        if r is None:
            self._spec["workload"].setdefault("env", {}).update(variables)
        else:
            r.env.update(variables)
        return self

    # --- the job ---------------------------------------------------------------------------

    def data(self, num_samples: int, shard_size: int, eval_samples: Optional[int] = None):
        d = {"num_samples": num_samples, "shard_size": shard_size}
        if eval_samples is not None:
            d["eval_samples"] = eval_samples
        self._spec["data"] = d
        return self

    def epochs(self, n: int) -> "JobBuilder":
        self._spec["epochs"] = n
        return self

    def checkpoint(self, dir: str, every_shards: Optional[int] = None) -> "JobBuilder":
        c: Dict[str, Any] = {"dir": dir}
        if every_shards is not None:
            c["every_shards"] = every_shards
        self._spec["checkpoint"] = c
        return self

    def rescale(self, how: str) -> "JobBuilder":
        """How a command's training group follows a plan: `restart` or `in_place` (SDK)."""
        self._spec["workload"]["rescale"] = how
        return self

    # --- placement -----------------------------------------------------------------------

    _STRATEGIES = ("strict_pack", "pack", "strict_spread", "spread")

    def place(self, *roles: str, strategy: str, share_devices: bool = False) -> "JobBuilder":
        """A placement group of `roles` with one of Ray's strategies: `strict_pack`, `pack`,
        `strict_spread` or `spread`. With `share_devices`, process i of each role shares one
        GPU with process i of the others (each role asks for a share, e.g. gpu=0.5)."""
        if not roles:
            raise BrainError("place(): name the roles to place")
        if strategy not in self._STRATEGIES:
            raise BrainError(
                f"place(): strategy {strategy!r}: expected one of {', '.join(self._STRATEGIES)}"
            )
        group = {"roles": list(roles), "strategy": strategy}
        if share_devices:
            group["share_devices"] = True
        self._spec.setdefault("placement", []).append(group)
        return self

    def colocate(
        self, *roles: str, strict: bool = True, share_devices: bool = False
    ) -> "JobBuilder":
        """The processes of `roles` on one node (`strict_pack`), or as few as can be (`pack`);
        with `share_devices`, process i of each role on one GPU too."""
        return self.place(
            *roles,
            strategy="strict_pack" if strict else "pack",
            share_devices=share_devices,
        )

    def spread(self, *roles: str, strict: bool = True) -> "JobBuilder":
        """The processes of `roles` each on a node of its own (`strict_spread`), or on as many
        as can be (`spread`)."""
        return self.place(*roles, strategy="strict_spread" if strict else "spread")

    def _training(self) -> List[str]:
        """The roles that run the job's workload: `ps` and `worker` of a ps job; of an
        allreduce job the one said `.topology("allreduce")`, else `worker`."""
        if self._spec["kind"] == "ps":
            return ["ps", "worker"]
        named = [
            n
            for n, r in self._roles.items()
            if r.spec.get("topology") == "allreduce" and not r.further
        ]
        return named or ["worker"]

    def build(self) -> Dict[str, Any]:
        """The spec, as the dict its YAML parses to."""
        spec = json.loads(json.dumps(self._spec))
        training = self._training()
        for name, r in self._roles.items():
            role = dict(r.spec)
            if name not in training:
                if r.program is not None:
                    role["command"] = list(r.program)
                if r.env:
                    role["env"] = dict(r.env)
            else:
                workload = spec["workload"]
                if r.program is not None:
                    given = workload.get("command")
                    if given is not None and given != r.program:
                        raise BrainError(
                            f"role {name}: run() gives the training roles a second program "
                            f"({' '.join(r.program)!r} after {' '.join(given)!r}); they run one "
                            "workload"
                        )
                    workload["command"] = list(r.program)
                if r.env:
                    workload.setdefault("env", {}).update(r.env)
            spec["roles"][name] = role
        return spec

    def to_yaml(self) -> str:
        """The spec as text the job master reads (JSON, which is YAML)."""
        return json.dumps(self.build(), indent=2) + "\n"

    def dry_run(self, file=None) -> str:
        """Prints the spec and returns it."""
        text = self.to_yaml()
        print(text, end="", file=file or sys.stdout)
        return text

    def _with_file(
        self, argv: List[str], after: List[str], absolute: bool, **kw
    ) -> subprocess.CompletedProcess:
        """Runs `argv SPEC after` with the spec in a temporary file. With `absolute`, a
        relative checkpoint directory is taken from the current directory (a spec file's is
        from its own directory); the brain wants it relative (inside the job's run directory)."""
        spec = self.build()
        ckpt = spec.get("checkpoint", {})
        if absolute and "dir" in ckpt and not os.path.isabs(ckpt["dir"]):
            ckpt["dir"] = os.path.abspath(ckpt["dir"])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{self._spec['name']}.yaml")
            with open(path, "w") as f:
                f.write(json.dumps(spec, indent=2) + "\n")
            return subprocess.run(argv + [path] + after, **kw)

    def validate(self, job_master: Optional[str] = None) -> str:
        """Has `job-master validate` check the spec on this machine; returns what it printed,
        raises BrainError with its reason."""
        exe = _binary("job-master", job_master)
        done = self._with_file(
            [exe, "validate"], [], absolute=True, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise BrainError((done.stderr or done.stdout).strip())
        return done.stdout

    def submit(self, brain: str = "http://127.0.0.1:50070", wait: bool = False, brainctl=None):
        """Submits the job through the brain (`brainctl submit`), raising CalledProcessError
        if the brain refused it."""
        exe = _binary("brainctl", brainctl)
        after = ["--brain", brain] + (["--wait"] if wait else [])
        return self._with_file([exe, "submit"], after, absolute=False, check=True)


def _binary(name: str, given: Optional[str]) -> str:
    if given:
        return given
    where = os.environ.get("BRAIN_BIN_DIR")
    if where:
        return os.path.join(where, name)
    found = shutil.which(name)
    if not found:
        raise BrainError(f"{name} is not on PATH: set BRAIN_BIN_DIR or pass its path")
    return found
