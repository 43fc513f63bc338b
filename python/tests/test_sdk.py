"""Unit tests of the SDK's pure parts (run by job-master/tests/pytorch_sdk.rs, or by hand:
`PYTHONPATH=DIR python -m unittest discover -s python/tests` with the SDK built into DIR)."""

import json
import os
import random
import tempfile
import unittest

from brain_sdk import BrainError, CheckpointDamaged, ProcessEnv
from brain_sdk import checkpoint as ckpt
from brain_sdk.job import Batch, ElasticJob, index_sum, local_batch, slice_of

ENV = {
    "BRAIN_MASTER_ADDR": "http://127.0.0.1:1",
    "BRAIN_ROLE": "worker",
    "BRAIN_INDEX": "2",
    "BRAIN_INCARNATION": "3",
    "BRAIN_SERVICE_ADDR": "127.0.0.1:4567",
    "BRAIN_CHECKPOINT_DIR": "/tmp/x",
    "RANK": "1",
    "WORLD_SIZE": "4",
    "MASTER_PORT": "29500",
}


class Steps(unittest.TestCase):
    def test_local_batches_add_up_to_the_global_batch(self):
        for world in range(1, 9):
            self.assertEqual(sum(local_batch(100, world, r) for r in range(world)), 100)
        self.assertEqual([local_batch(10, 4, r) for r in range(4)], [3, 3, 2, 2])

    def test_the_ranks_slices_cover_a_step_once(self):
        rng = random.Random(5)
        for _ in range(200):
            ranges = [(rng.randrange(10_000), rng.randrange(1, 40)) for _ in range(rng.randrange(1, 6))]
            total = sum(n for _, n in ranges)
            world = rng.randrange(1, 9)
            got = []
            for rank in range(world):
                mine = slice_of(ranges, total * rank // world, total * (rank + 1) // world)
                self.assertLessEqual(abs(len(mine) - total / world), 1)
                got.extend(mine)
            want = [i for s, n in ranges for i in range(s, s + n)]
            self.assertEqual(got, want)
            self.assertEqual(sum(want), sum(index_sum(s, n) for s, n in ranges))

    def test_the_loss_scale_makes_ddp_average_over_the_step(self):
        b = Batch(indices=[1, 2, 3], step=1, epoch=0, global_samples=10, world_size=4)
        self.assertAlmostEqual(b.loss_scale, 0.4)


class Sampler(unittest.TestCase):
    def test_a_dataloader_gets_each_step_s_indices_in_step(self):
        import torch
        from brain_sdk.pytorch import ElasticBatchSampler

        class Steps:  # what ElasticBatchSampler reads of a job: its batches
            def __init__(self):
                self.trained = []

            def batches(self):
                for step, idx in enumerate([[4, 5], [6], [7, 8]], start=1):
                    yield Batch(indices=idx, step=step, epoch=0, global_samples=3, world_size=2)
                    self.trained.append(step)  # the loop body ran: the step is over

        job = Steps()
        sampler = ElasticBatchSampler(job)
        data = torch.arange(10) * 10
        loader = torch.utils.data.DataLoader(data, batch_sampler=sampler, num_workers=0)
        seen = []
        for batch in loader:
            self.assertEqual(job.trained, list(range(1, len(seen) + 1)), "no step ends early")
            seen.append((batch.tolist(), sampler.batch.step))
        self.assertEqual(seen, [([40, 50], 1), ([60], 2), ([70, 80], 3)])


class Environment(unittest.TestCase):
    def test_the_agent_s_variables_are_read(self):
        e = ProcessEnv.from_env(ENV)
        self.assertEqual((e.index, e.incarnation, e.rank, e.world_size), (2, 3, 1, 4))
        self.assertEqual((e.host, e.kind, e.resume_from), ("127.0.0.1", "allreduce", None))
        self.assertEqual(ProcessEnv.from_env({**ENV, "BRAIN_PS_VERSION": "1"}).kind, "ps")

    def test_a_script_run_by_hand_is_told_how_to_run_it(self):
        env = dict(ENV)
        del env["BRAIN_MASTER_ADDR"]
        with self.assertRaisesRegex(BrainError, "BRAIN_MASTER_ADDR is not set: run this script as"):
            ProcessEnv.from_env(env)
        with self.assertRaisesRegex(BrainError, "RANK='one' is not a whole number"):
            ProcessEnv.from_env({**ENV, "RANK": "one"})
        with self.assertRaisesRegex(BrainError, "is not a role name"):
            ProcessEnv.from_env({**ENV, "BRAIN_ROLE": "Chief Engineer"})
        # Any role group by name; a service's process has no rank of a training group.
        self.assertEqual(ProcessEnv.from_env({**ENV, "BRAIN_ROLE": "rollout"}).role, "rollout")
        service = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE")}
        service.update(BRAIN_ROLE="reward", BRAIN_TOPOLOGY="service")
        self.assertEqual(ProcessEnv.from_env(service).topology, "service")

    def test_the_jobs_secret_is_read_from_an_owner_only_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "job.token")
            with self.assertRaisesRegex(BrainError, "BRAIN_JOB_TOKEN_FILE is not set"):
                ProcessEnv.from_env(ENV).token()
            env = ProcessEnv.from_env({**ENV, "BRAIN_JOB_TOKEN_FILE": path})
            with self.assertRaisesRegex(BrainError, "job.token: No such file"):
                env.token()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, b"ab" * 32 + b"\n")
            os.close(fd)
            self.assertEqual(env.token(), "ab" * 32)
            os.chmod(path, 0o644)
            with self.assertRaisesRegex(BrainError, "readable by others"):
                env.token()
            os.chmod(path, 0o600)
            with open(path, "w") as f:
                f.write("short")
            with self.assertRaisesRegex(BrainError, "not a token"):
                env.token()

    def test_a_bad_batch_size_is_refused_before_anything_starts(self):
        with self.assertRaisesRegex(BrainError, "batch_size=0"):
            ElasticJob(0, env=ProcessEnv.from_env(ENV))


class Checkpoints(unittest.TestCase):
    def test_a_checkpoint_round_trips_and_a_damaged_one_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c", "state.pt")
            digest = ckpt.write_atomic(path, {"user": [1, 2], "brain_sdk": {"step": 3}})
            self.assertEqual(os.listdir(os.path.dirname(path)), ["state.pt"], "no temporary left")
            self.assertEqual(ckpt.read_verified(path, digest)["user"], [1, 2])
            with open(path, "ab") as f:
                f.write(b"x")
            with self.assertRaisesRegex(CheckpointDamaged, "is damaged: its SHA-256 is"):
                ckpt.read_verified(path, digest)
            os.remove(path)
            with self.assertRaisesRegex(CheckpointDamaged, "is gone"):
                ckpt.read_verified(path, digest)

    def test_a_manifest_gone_or_garbled_is_damaged_and_one_unreadable_here_is_not(self):
        with tempfile.TemporaryDirectory() as d:
            m = os.path.join(d, "manifest.json")
            with self.assertRaises(CheckpointDamaged):
                ckpt.manifest_parts(m)
            with open(m, "w") as f:
                f.write('{"id": 1, "ki')
            with self.assertRaisesRegex(CheckpointDamaged, "cannot read checkpoint manifest"):
                ckpt.manifest_parts(m)
            # A directory where the manifest should be: an error of this node, not damage
            # worth falling back for.
            os.remove(m)
            os.mkdir(m)
            with self.assertRaises(BrainError) as e:
                ckpt.manifest_parts(m)
            self.assertNotIsInstance(e.exception, CheckpointDamaged)

    def test_a_manifest_names_the_model_file(self):
        with tempfile.TemporaryDirectory() as d:
            m = os.path.join(d, "manifest.json")
            with open(m, "w") as f:
                json.dump({"id": 1, "kind": "allreduce", "step": 7,
                           "model": {"index": 0, "path": "/p", "digest": "ab", "keys": 0}}, f)
            self.assertEqual(ckpt.manifest_model(m), ("/p", "ab", 7))
            with open(m, "w") as f:
                json.dump({"id": 1, "kind": "ps", "step": 7, "ps": []}, f)
            with self.assertRaisesRegex(BrainError, "names no model file"):
                ckpt.manifest_model(m)
            with self.assertRaisesRegex(BrainError, "cannot read checkpoint manifest"):
                ckpt.manifest_model(os.path.join(d, "missing.json"))


# One rank of a group of two: forms the SDK's collective and takes rank 0's bytes (and rank 1's).
_PEER = r'''
import sys
from brain_sdk.pytorch import TorchCollective
rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
g = TorchCollective(timeout_s=60)
g.form(rank, 2, "127.0.0.1", port)
got = g.broadcast_bytes(bytes(range(256)) * 4099 if rank == 0 else None)
empty = g.broadcast_bytes(b"" if rank == 0 else None)
# From another rank (a restarted group's holder of the flash copy sends it).
from1 = g.broadcast_bytes(b"from rank 1" if rank == 1 else None, src=1)
# A state's tensors as they are (every dtype as bytes; a transposed one made contiguous).
import torch
from brain_sdk import flash
w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
state = {"w": w, "tied": w, "t": w.t(), "h": torch.tensor([1.5], dtype=torch.bfloat16),
         "mask": torch.tensor([True, False]), "n": torch.tensor(7), "empty": torch.zeros(0),
         "step": 9}
head, tensors = flash.skeleton(state) if rank == 0 else (None, [])
head = g.broadcast_bytes(head)
meta, received = flash.empty_for(head)
if rank == 0:
    received = [t.contiguous() for t in tensors]
for t in received:
    g.broadcast_tensor(t)
back = flash.rebuild(meta, received)
same = all(torch.equal(back[k], state[k]) for k in state if k != "step")
same = same and back["step"] == 9 and back["tied"] is back["w"]
t1 = torch.full((3,), 5.0) if rank == 1 else torch.zeros(3)
g.broadcast_tensor(t1, src=1)
same = same and from1 == b"from rank 1" and torch.equal(t1, torch.full((3,), 5.0))
open(out, "wb").write(got + b"|" + str(len(empty)).encode() + b"|" + str(same).encode())
g.leave()
'''


class PeerState(unittest.TestCase):
    def test_a_state_taken_apart_is_rebuilt_whole(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch")
        from brain_sdk import flash

        w = torch.ones(2, 3)
        state = {"user": {"w": w, "again": w, "note": "x"}, "brain_sdk": {"step": 9}}
        head, tensors = flash.skeleton(state)
        self.assertEqual(len(tensors), 1, "a tensor named twice travels once")
        meta, empty = flash.empty_for(head)
        self.assertEqual([tuple(t.shape) for t in empty], [(2, 3)])
        back = flash.rebuild(meta, tensors)
        self.assertTrue(torch.equal(back["user"]["w"], w))
        # A rank that already holds the state receives into one reused buffer.
        self.assertEqual([t.numel() for t in flash.scratch_for(head)], [2 * 3 * 4])
        self.assertIs(back["user"]["again"], back["user"]["w"])
        self.assertEqual(back["brain_sdk"], {"step": 9})

    def test_one_rank_s_bytes_and_tensors_reach_the_other_rank_whole(self):
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            self.skipTest("no torch")
        import subprocess
        import sys

        from brain_sdk.master import reserve_port

        port = reserve_port()
        with tempfile.TemporaryDirectory() as d:
            outs = [os.path.join(d, f"r{r}") for r in (0, 1)]
            ranks = [
                subprocess.Popen([sys.executable, "-c", _PEER, str(r), str(port), outs[r]])
                for r in (0, 1)
            ]
            self.assertEqual([p.wait(timeout=120) for p in ranks], [0, 0])
            want = bytes(range(256)) * 4099 + b"|0|True"
            for out in outs:
                with open(out, "rb") as f:
                    self.assertEqual(f.read(), want)


if __name__ == "__main__":
    unittest.main()


class Builder(unittest.TestCase):
    def test_roles_programs_and_bounds_land_where_the_yaml_puts_them(self):
        import sys

        from brain_sdk import JobBuilder

        spec = (
            JobBuilder("rl", kind="allreduce")
            .env(OMP_NUM_THREADS="1")
            .role("worker").run("python3 train.py --fast").resource(cpu=2, memory="1Gi").total(2)
            .role("rollout").run("rl.rollout:Engine").total(2).min(1).max(4).per_group(1)
            .env(MODE="fast").failover("process")
            .role("driver").topology("single").run(["drive", "--once"])
            .data(num_samples=100, shard_size=10)
            .checkpoint("ckpt")
            .build()
        )
        self.assertEqual(spec["workload"]["command"], ["python3", "train.py", "--fast"])
        self.assertEqual(spec["workload"]["env"], {"OMP_NUM_THREADS": "1"})
        self.assertEqual(spec["roles"]["worker"], {"resources": {"cpu": 2, "memory": "1Gi"}, "replicas": 2})
        self.assertEqual(
            spec["roles"]["rollout"]["command"],
            [sys.executable, "-m", "brain_sdk.roles", "rl.rollout:Engine"],
        )
        self.assertEqual(spec["roles"]["rollout"]["env"], {"MODE": "fast"})
        self.assertEqual(spec["roles"]["driver"], {"topology": "single", "command": ["drive", "--once"]})
        self.assertEqual(json.loads(JobBuilder("x").to_yaml())["name"], "x")

    def test_the_all_reduce_group_is_named_by_its_topology_said_in_any_order(self):
        from brain_sdk import JobBuilder

        spec = (
            JobBuilder("rl")
            .role("actor").run("python3 train.py").env(A="1").total(2).topology("allreduce")
            .role("rollout").run(["engine"]).env(B="2")
            .build()
        )
        self.assertEqual(spec["workload"]["command"], ["python3", "train.py"])
        self.assertEqual(spec["workload"]["env"], {"A": "1"})
        self.assertEqual(spec["roles"]["actor"], {"replicas": 2, "topology": "allreduce"})
        self.assertEqual(spec["roles"]["rollout"], {"command": ["engine"], "env": {"B": "2"}})
        # Without the topology, `actor` is a service with a program of its own.
        plain = JobBuilder("rl").role("actor").run(["a"]).role("worker").run(["t"]).build()
        self.assertEqual(plain["roles"]["actor"], {"command": ["a"]})
        self.assertEqual(plain["workload"]["command"], ["t"])
        # A ps job's training roles run one workload.
        with self.assertRaisesRegex(BrainError, "role worker: run\\(\\) gives the training roles a second"):
            JobBuilder("p", kind="ps").role("ps").run(["a"]).role("worker").run(["b"]).build()
        # A further all-reduce group runs its own program beside the training group.
        two = (
            JobBuilder("rl")
            .role("critic").topology("allreduce", training=False).run(["critic"]).total(2)
            .role("actor").topology("allreduce").run(["train"]).total(2)
            .build()
        )
        self.assertEqual(two["workload"]["command"], ["train"])
        self.assertEqual(
            two["roles"]["critic"],
            {"replicas": 2, "topology": "allreduce", "command": ["critic"]},
        )
        self.assertEqual(two["roles"]["actor"], {"replicas": 2, "topology": "allreduce"})
        with self.assertRaisesRegex(BrainError, "training=False is for a further all-reduce"):
            JobBuilder("rl").role("x").topology("service", training=False)

    def test_placement_groups_land_where_the_yaml_puts_them(self):
        from brain_sdk import JobBuilder

        spec = (
            JobBuilder("rl")
            .role("worker").total(2)
            .role("critic").topology("single").run(["critic"]).total(1)
            .role("rollout").run(["engine"]).total(3)
            .colocate("worker", "critic")
            .spread("rollout", strict=False)
            .build()
        )
        self.assertEqual(
            spec["placement"],
            [
                {"roles": ["worker", "critic"], "strategy": "strict_pack"},
                {"roles": ["rollout"], "strategy": "spread"},
            ],
        )
        shared = (
            JobBuilder("rl")
            .role("worker").total(2).resource(gpu=0.6)
            .role("rollout").run(["engine"]).total(2).resource(gpu=0.4)
            .colocate("worker", "rollout", strict=False, share_devices=True)
            .build()
        )
        self.assertEqual(
            shared["placement"],
            [{"roles": ["worker", "rollout"], "strategy": "pack", "share_devices": True}],
        )
        self.assertEqual(shared["roles"]["rollout"]["resources"], {"gpu": 0.4})
        self.assertEqual(shared["roles"]["worker"]["resources"], {"gpu": 0.6})
        with self.assertRaisesRegex(BrainError, "strategy 'sideways'"):
            JobBuilder("x").place("worker", strategy="sideways")
        with self.assertRaisesRegex(BrainError, "name the roles"):
            JobBuilder("x").colocate()

    def test_what_the_builder_cannot_say_is_refused_with_the_reason(self):
        from brain_sdk import JobBuilder

        with self.assertRaisesRegex(BrainError, "a share of one device"):
            JobBuilder("x").role("rollout").resource(gpu=1.5)
        with self.assertRaisesRegex(BrainError, r"call \.role\(name\) first"):
            JobBuilder("x").total(2)
        with self.assertRaisesRegex(BrainError, "kind 'mpi'"):
            JobBuilder("x", kind="mpi")
        with self.assertRaisesRegex(BrainError, "give the program"):
            JobBuilder("x").role("a").run([])


class CallChains(unittest.TestCase):
    def test_a_call_coming_back_up_its_chain_is_refused_with_the_chain(self):
        from brain_sdk.roles import refused_chain

        self.assertIsNone(refused_chain(["driver-0"], "reward-1"))
        self.assertIsNone(refused_chain(["driver-0", "reward-1"], "critic-0"))
        why = refused_chain(["driver-0", "reward-1"], "reward-1")
        self.assertIn("a cycle of calls that can never be served", why)
        self.assertIn("driver-0 → reward-1 → reward-1", why)
        deep = [f"a-{i}" for i in range(32)]
        self.assertIn("nested more than 32 deep", refused_chain(deep, "b-0"))


class CallTally(unittest.TestCase):
    def test_calls_and_serving_add_up_to_the_totals_the_master_is_sent(self):
        from brain_sdk.roles import _Tally

        t = _Tally()
        started = []
        t._start = started.append  # no reporter thread, no master
        t.called("env", "rollout", 0.5)
        t.called("env", "rollout", 0.25)
        t.called("env", "reward", 1.0)
        t.serving("env", 0.2)
        self.assertEqual(
            t._now(), ({"rollout": (2, 0.75), "reward": (1, 1.0)}, 1, 0.2)
        )
        # The reporter is asked to start with the process's environment.
        self.assertEqual(started, ["env"] * 4)


class NodeInterface(unittest.TestCase):
    def test_the_interface_holding_an_address_is_found(self):
        from brain_sdk.env import node_interface

        self.assertEqual(node_interface("127.0.0.1"), "lo")
        self.assertIsNone(node_interface("192.0.2.77"))  # TEST-NET-1: nobody's


class StackDumps(unittest.TestCase):
    def test_sigusr1_appends_every_thread_s_stack_to_the_agent_s_file(self):
        # In a child process: faulthandler's registration lasts for the life of the process.
        import subprocess
        import sys
        import textwrap

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "stacks", "worker-0.txt")
            script = textwrap.dedent(
                f"""
                import os, signal, time
                from brain_sdk.job import install_stack_dump
                install_stack_dump({path!r})
                def stuck_in_a_collective():
                    os.kill(os.getpid(), signal.SIGUSR1)
                    time.sleep(0.2)
                stuck_in_a_collective()
                print("alive")
                """
            )
            out = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
            )
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("alive", out.stdout, "SIGUSR1 did not end the process")
            with open(path) as f:
                text = f.read()
            self.assertIn("stuck_in_a_collective", text)
            self.assertIn("most recent call first", text)


class RoleCheckpoints(unittest.TestCase):
    """A further all-reduce group's restore: the newest whole file the job master keeps."""

    def test_a_missing_or_damaged_newest_file_restores_the_one_before_and_says_so(self):
        import contextlib
        import io

        from brain_sdk.roles import remove_unkept, restore_kept

        with tempfile.TemporaryDirectory() as d:
            def saved(step):
                path = os.path.join(d, f"step-{step:012d}-0.1.pt")
                digest = ckpt.write_atomic(path, {"user": {"step": step}, "brain_sdk": {}})
                return (step, path, digest)

            older, newest = saved(5), saved(10)
            self.assertEqual(restore_kept("critic", [newest, older]), (10, {"step": 10}))
            self.assertIsNone(restore_kept("critic", []))
            # The newest damaged: the one before, and stderr names why.
            with open(newest[1], "r+b") as f:
                f.write(b"x")
            said = io.StringIO()
            with contextlib.redirect_stderr(said):
                self.assertEqual(restore_kept("critic", [newest, older]), (5, {"step": 5}))
            self.assertIn("critic restores step 5, not its newest checkpoint: step 10:", said.getvalue())
            self.assertIn("is damaged", said.getvalue())
            # Neither whole: refused, naming both.
            os.unlink(older[1])
            with self.assertRaises(BrainError) as e:
                restore_kept("critic", [newest, older])
            self.assertIn("step 10: checkpoint", str(e.exception))
            self.assertIn(f"step 5: checkpoint {older[1]} is missing", str(e.exception))
            # Only the kept files stay.
            extra = saved(15)
            remove_unkept(d, [extra[1], newest[1]])
            self.assertEqual(sorted(os.listdir(d)), sorted(os.path.basename(p) for p in [extra[1], newest[1]]))
