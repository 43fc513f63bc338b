"""Flash checkpoint slots (`brain_sdk.flash`), the process's half, without an agent: the agent's
part is played here by flock and the slots' state files. Needs torch."""

import fcntl
import json
import os
import tempfile
import threading
import time
import unittest

try:
    import torch
except ImportError:  # pragma: no cover - the SDK's core runs without torch
    torch = None

from brain_sdk import BrainError
from brain_sdk import flash


def _set(store, slot, **fields):
    path = store.slot_file(slot) + ".json"
    with open(path) as f:
        st = json.load(f)
    st.update(fields)
    # Replaced whole, as the agent does: a save running beside it never reads half a file.
    with open(path + ".tmp", "w") as f:
        json.dump(st, f)
    os.replace(path + ".tmp", path)


@unittest.skipIf(torch is None, "torch is not installed")
class FlashSlots(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.store = flash.FlashStore(self.dir.name, 64 << 20)

    def tearDown(self):
        self.store.close()
        self.dir.cleanup()

    def save(self, state, step):
        return self.store.save(
            state, step=step, rank=0, world=1, persist=True, incarnation=1, sdk={"step": step}
        )

    def step_2_being_written_out(self):
        """Step 1 committed in one slot, step 2 in the other being written out: its lock held
        (as the agent holds it) by the file returned."""
        a = self.save({"x": torch.ones(3)}, 1)
        b = self.save({"x": torch.ones(3) * 2}, 2)
        _set(self.store, a["slot"], state="committed", digest="da")
        _set(self.store, b["slot"], state="persisting")
        held = open(self.store.slot_file(b["slot"]))
        fcntl.flock(held, fcntl.LOCK_EX)
        return a, b, held

    def test_a_state_round_trips_with_its_dtypes_shapes_and_tied_tensors(self):
        w = torch.randn(4, 5)
        state = {
            "model": {"w": w, "tied": w, "t": w.t()},
            "opt": [torch.arange(7), torch.zeros(2, dtype=torch.bool), torch.empty(0, 3)],
            "epoch": 3,
            "name": "x",
        }
        done = self.save(state, 12)
        back, fields = flash.read_state(self.store.slot_file(done["slot"]))
        self.assertTrue(torch.equal(back["model"]["w"], w))
        self.assertIs(back["model"]["tied"], back["model"]["w"])
        self.assertTrue(torch.equal(back["model"]["t"], w.t()))
        self.assertEqual(back["opt"][1].dtype, torch.bool)
        self.assertEqual(tuple(back["opt"][2].shape), (0, 3))
        self.assertEqual((back["epoch"], back["name"]), (3, "x"))
        self.assertEqual((fields["step"], fields["sdk"]), (12, {"step": 12}))
        # What is read back is a copy: the slot may be written again under it.
        self.save({"model": {"w": torch.zeros(4, 5)}}, 13)
        self.save({"model": {"w": torch.zeros(4, 5)}}, 14)
        self.assertTrue(torch.equal(back["model"]["w"], w))

    def test_two_copies_at_most_and_one_not_written_out_is_replaced_whole(self):
        a = self.save({"x": torch.ones(3)}, 1)
        b = self.save({"x": torch.ones(3) * 2}, 2)
        self.assertNotEqual(a["slot"], b["slot"])
        self.assertIsNone(a["dropped"])
        # Neither is written out yet: the third save replaces the older, step 1.
        c = self.save({"x": torch.ones(3) * 3}, 3)
        self.assertEqual((c["slot"], c["dropped"]), (a["slot"], 1))
        steps = sorted(self.store.status(s)["step"] for s in range(flash.SLOTS))
        self.assertEqual(steps, [2, 3])

    def test_a_slot_being_written_out_is_never_touched_nor_the_committed_copy(self):
        a = self.save({"x": torch.ones(3)}, 1)
        b = self.save({"x": torch.ones(3) * 2}, 2)
        # The agent writes slot a out (its lock held); slot b is committed.
        _set(self.store, a["slot"], state="persisting")
        _set(self.store, b["slot"], state="committed", digest="d")
        with open(self.store.slot_file(a["slot"])) as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            c = self.save({"x": torch.ones(3) * 3}, 3)
            self.assertEqual((c["slot"], c["skipped"], c["dropped"]), (None, True, 3))
            # b only waiting to be written out: the save replaces it.
            _set(self.store, b["slot"], state="ready")
            d = self.save({"x": torch.ones(3) * 4}, 4)
            self.assertEqual((d["slot"], d["dropped"]), (b["slot"], 2))
        back, _ = flash.read_state(self.store.slot_file(a["slot"]))
        self.assertTrue(torch.equal(back["x"], torch.ones(3)), "step 1 was not mixed")
        # An agent that died writing a out left it "persisting", its lock free: taken.
        _set(self.store, b["slot"], state="committed", digest="d")
        e = self.save({"x": torch.ones(3) * 5}, 5)
        self.assertEqual((e["slot"], e["dropped"]), (a["slot"], 1))

    def test_a_held_copy_waits_for_its_release_and_is_replaced_like_a_ready_one(self):
        a = self.store.save(
            {"x": torch.ones(3)}, step=4, rank=0, world=1, persist=True, incarnation=1,
            sdk={"step": 4}, hold=True,
        )
        # The agent writes out "ready" copies only: a cut's copy waits for the master's word.
        self.assertEqual(self.store.status(a["slot"])["state"], "held")
        self.store.release(a["slot"])
        st = self.store.status(a["slot"])
        self.assertEqual((st["state"], st["step"], st["persist"]), ("ready", 4, True))
        # Released twice, or a slot no longer held: nothing changes.
        _set(self.store, a["slot"], state="persisted", digest="d")
        self.store.release(a["slot"])
        self.assertEqual(self.store.status(a["slot"])["state"], "persisted")
        # A held copy never released (the master refused the cut) is dropped for a newer save.
        b = self.store.save(
            {"x": torch.ones(3)}, step=5, rank=0, world=1, persist=True, incarnation=1,
            sdk={"step": 5}, hold=True,
        )
        c = self.save({"x": torch.ones(3)}, 6)
        self.assertEqual((c["slot"], c["dropped"]), (b["slot"], 5))

    def test_a_copy_written_out_and_not_yet_answered_is_never_replaced(self):
        a = self.save({"x": torch.ones(3)}, 1)
        b = self.save({"x": torch.ones(3) * 2}, 2)
        _set(self.store, a["slot"], state="committed", digest="da")
        # b is written out; the job master may be committing step 2 right now.
        _set(self.store, b["slot"], state="persisted", digest="db")
        c = self.save({"x": torch.ones(3) * 3}, 3)
        self.assertEqual((c["slot"], c["skipped"]), (None, True))
        self.assertEqual(self.store.holding(2, "db"), self.store.slot_file(b["slot"]))
        self.assertEqual(self.store.holding(1, "da"), self.store.slot_file(a["slot"]))
        # Committed: the older copy goes. Refused: the refused one goes.
        _set(self.store, b["slot"], state="committed")
        d = self.save({"x": torch.ones(3) * 4}, 4)
        self.assertEqual(d["slot"], a["slot"])
        _set(self.store, a["slot"], state="refused")
        e = self.save({"x": torch.ones(3) * 5}, 5)
        self.assertEqual(e["slot"], a["slot"])

    def test_a_shard_s_copy_the_job_master_committed_is_kept_before_its_agent_hears(self):
        def shard(x, step, committed=None):
            return self.store.save(
                {"x": torch.ones(3) * x}, step=step, rank=1, world=2, persist=True,
                incarnation=1, sdk={"step": step}, committed=committed,
            )

        asked = []

        def master_says(step):
            def committed():
                asked.append(step)
                return step
            return committed

        a = shard(1, 1)
        _set(self.store, a["slot"], state="committed", digest="da")
        # Nothing unsure: the job master is not asked.
        b = shard(2, 2, master_says(1))
        self.assertEqual((b["slot"], asked), (1 - a["slot"], []))
        # Step 2's part is written out; the job master has committed step 2 (the other rank's
        # part landed last), which this agent has not heard yet: step 1's slot goes.
        _set(self.store, b["slot"], state="persisted", digest="db")
        c = shard(3, 3, master_says(2))
        self.assertEqual((c["slot"], asked), (a["slot"], [2]))
        self.assertEqual(self.store.holding(2, "db"), self.store.slot_file(b["slot"]))
        # Step 3's written out too and the master still at step 2: step 3's is replaced,
        # step 2's kept (not the newest written out, as it would be without asking).
        _set(self.store, c["slot"], state="persisted", digest="dc")
        d = shard(4, 4, master_says(2))
        self.assertEqual((d["slot"], asked), (c["slot"], [2, 2]))
        self.assertEqual(self.store.holding(2, "db"), self.store.slot_file(b["slot"]))
        # Without anyone to ask, the copy marked committed is the one kept, as before.
        _set(self.store, b["slot"], state="committed")
        _set(self.store, d["slot"], state="persisted", digest="dd")
        e = shard(5, 5)
        self.assertEqual(e["slot"], d["slot"])

    def test_a_save_told_to_wait_lands_once_the_write_out_and_its_answer_are_in(self):
        a, b, held = self.step_2_being_written_out()

        def agent():
            # The agent ends its write-out of step 2 (its answer then due), then hears the job
            # master commit it.
            time.sleep(0.3)
            _set(self.store, b["slot"], state="persisted", digest="db")
            fcntl.flock(held, fcntl.LOCK_UN)
            time.sleep(0.2)
            _set(self.store, b["slot"], state="committed")

        began = time.monotonic()
        t = threading.Thread(target=agent)
        t.start()
        # Not told to wait, or not long enough: skipped.
        c = self.save({"x": torch.ones(3) * 3}, 3)
        self.assertTrue(c["skipped"], c)
        c = self.store.save({"x": torch.ones(3) * 3}, step=3, rank=0, world=1, persist=True,
                            incarnation=1, sdk={"step": 3}, wait_s=0.1)
        self.assertTrue(c["skipped"], c)
        self.assertGreaterEqual(c["waited_s"], 0.1)
        # Told to wait: it lands once step 2 is committed, in step 1's slot.
        d = self.store.save({"x": torch.ones(3) * 4}, step=4, rank=0, world=1, persist=True,
                            incarnation=1, sdk={"step": 4}, wait_s=10)
        landed = time.monotonic() - began
        t.join()
        held.close()
        self.assertEqual((d["slot"], d["skipped"]), (a["slot"], False), d)
        self.assertGreaterEqual(landed, 0.5)
        self.assertLess(d["waited_s"], 5)
        self.assertEqual(self.store.holding(2, "db"), self.store.slot_file(b["slot"]))
        back, _ = flash.read_state(self.store.slot_file(d["slot"]))
        self.assertTrue(torch.equal(back["x"], torch.ones(3) * 4))

    def test_a_write_out_that_ends_between_the_look_and_the_lock_is_left_alone(self):
        # The save reads the slots' states, then locks the one it chose. An agent that ends
        # its write-out in between leaves the copy's answer due: it must not be taken (CI
        # caught a save landing on step 2 this way, under load).
        _, b, held = self.step_2_being_written_out()
        looked = self.store._candidates
        ended = []

        def look_then_the_agent_ends(known=None):
            out = looked(known)
            if not ended:
                ended.append(True)
                _set(self.store, b["slot"], state="persisted", digest="db")
                fcntl.flock(held, fcntl.LOCK_UN)
            return out

        self.store._candidates = look_then_the_agent_ends
        try:
            c = self.save({"x": torch.ones(3) * 3}, 3)
        finally:
            self.store._candidates = looked
            held.close()
        self.assertEqual(ended, [True])
        self.assertTrue(c["skipped"], c)
        back, _ = flash.read_state(self.store.slot_file(b["slot"]))
        self.assertTrue(torch.equal(back["x"], torch.ones(3) * 2))
        self.assertEqual(self.store.holding(2, "db"), self.store.slot_file(b["slot"]))

    def test_the_newest_committed_copy_is_kept_whatever_the_saves_after_it(self):
        a = self.save({"x": torch.ones(3)}, 1)
        _set(self.store, a["slot"], state="committed", digest="d")
        for step in range(2, 8):
            got = self.save({"x": torch.ones(3) * step}, step)
            self.assertNotEqual(got["slot"], a["slot"])
        self.assertEqual(self.store.holding(1, "d"), self.store.slot_file(a["slot"]))

    def test_a_state_over_half_the_budget_is_refused_with_the_sizes(self):
        with self.assertRaises(BrainError) as e:
            self.save({"x": torch.zeros(40 << 20, dtype=torch.uint8)}, 1)
        text = str(e.exception)
        self.assertIn("the state is 0.04 GiB", text)
        self.assertIn("two copies of at most 0.03 GiB", text)
        self.assertEqual([self.store.status(s) for s in range(flash.SLOTS)], [None, None])

    def test_the_committed_copy_is_found_by_its_step_and_digest(self):
        a = self.save({"x": torch.ones(3)}, 5)
        _set(self.store, a["slot"], state="persisted", digest="abc")
        self.assertEqual(self.store.holding(5, "abc"), self.store.slot_file(a["slot"]))
        self.assertIsNone(self.store.holding(5, "other"))
        self.assertIsNone(self.store.holding(4, "abc"))
        _set(self.store, a["slot"], state="kept")
        self.assertEqual(self.store.holding(5, None), self.store.slot_file(a["slot"]))

    def test_a_snapshot_cut_short_is_refused_with_the_reason(self):
        done = self.save({"w": torch.arange(1000.0), "v": torch.ones(100)}, 3)
        with open(self.store.slot_file(done["slot"]), "rb") as f:
            whole = f.read(done["bytes"])
        cut = os.path.join(self.dir.name, "cut")
        with open(cut, "wb") as f:
            f.write(whole[:-200])
        # Refused with the reason, before any tensor is copied; the whole file reads back.
        with self.assertRaisesRegex(BrainError, "cut short"):
            flash.read_state(cut)
        with open(cut, "wb") as f:
            f.write(whole)
        back, _ = flash.read_state(cut)
        self.assertTrue(torch.equal(back["w"], torch.arange(1000.0)))

    def test_a_file_that_is_not_a_snapshot_is_refused(self):
        path = os.path.join(self.dir.name, "junk")
        with open(path, "wb") as f:
            f.write(b"not a snapshot at all")
        with self.assertRaises(BrainError):
            flash.read_state(path)


@unittest.skipIf(torch is None, "torch is not installed")
class RestoreFromMemoryOrDisk(unittest.TestCase):
    """`ElasticJob`'s restore of a committed flash checkpoint, the master left out: the copy
    this node holds, else the one on disk."""

    def setUp(self):
        from brain_sdk import checkpoint as ckpt
        from brain_sdk.job import ElasticJob

        self.dir = tempfile.TemporaryDirectory()
        os.mkdir(os.path.join(self.dir.name, "shm"))
        self.store = flash.FlashStore(os.path.join(self.dir.name, "shm"), 64 << 20)
        self.state = {"w": torch.arange(10.0)}
        done = self.store.save(
            self.state, step=7, rank=0, world=1, persist=True, incarnation=1,
            sdk={"step": 7, "applied_samples": 70, "applied_index_sum": 2415},
        )
        self.slot = self.store.slot_file(done["slot"])
        # The agent's half: the copy written out with its digest, and committed.
        self.disk = os.path.join(self.dir.name, "part-0.bin")
        with open(self.slot, "rb") as src, open(self.disk, "wb") as dst:
            dst.write(src.read())
        self.digest = ckpt.sha256_of(self.disk)
        _set(self.store, done["slot"], state="committed", digest=self.digest)
        self.job = ElasticJob.__new__(ElasticJob)
        self.job.rank, self.job.world_size, self.job.resume_from = 0, 1, "manifest"
        self.job._flash = self.store

    def tearDown(self):
        self.store.close()
        self.dir.cleanup()

    def restore(self, device=None):
        return self.job._restore_flash(7, [(self.disk, self.digest)], device)

    def devices(self):
        """CPU, and the GPU where there is one (the device checks run these tests there)."""
        return ["cpu"] + (["cuda:0"] if torch.cuda.is_available() else [])

    def test_each_tensor_is_made_on_the_device_asked_for_from_memory_and_from_disk(self):
        for device in self.devices():
            with self.subTest(device=device):
                back = self.restore(device)
                self.assertEqual(self.job.restored_from, "memory")
                self.assertEqual(back["w"].device, torch.device(device))
                self.assertTrue(torch.equal(back["w"].cpu(), self.state["w"]))
                state, fields = flash.read_verified(self.disk, self.digest, device)
                self.assertEqual(state["w"].device, torch.device(device))
                self.assertTrue(torch.equal(state["w"].cpu(), self.state["w"]))
                # The copies to a GPU run from page-locked memory where the driver allows it;
                # on the CPU nothing is locked.
                if device == "cpu":
                    self.assertFalse(fields["read_pinned"])

    def test_the_copy_in_memory_is_read_when_the_node_holds_it(self):
        back = self.restore()
        self.assertEqual(self.job.restored_from, "memory")
        self.assertTrue(torch.equal(back["w"], self.state["w"]))
        self.assertEqual((self.job.step, self.job.applied_samples), (7, 70))

    def test_a_copy_gone_from_memory_is_read_from_disk_instead_of_failing(self):
        # Its state file says the slot holds the step, the slot itself is gone (removed by
        # hand, the node's tmpfs cleaned): the process restarted crash-looped on it before.
        os.unlink(self.slot)
        with self.assertLogs("brain_sdk", level="WARNING") as logs:
            back = self.restore()
        self.assertEqual(self.job.restored_from, "disk")
        self.assertTrue(torch.equal(back["w"], self.state["w"]))
        self.assertIn("restoring from disk", "\n".join(logs.output))

    def test_a_damaged_copy_on_disk_is_refused_when_memory_has_none(self):
        os.unlink(self.slot)
        with open(self.disk, "r+b") as f:
            f.seek(100)
            f.write(b"x")
        with self.assertRaisesRegex(BrainError, "damaged"):
            self.restore()


if __name__ == "__main__":
    unittest.main()
