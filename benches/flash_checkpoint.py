"""Training blocked per checkpoint save, side by side in one run (issue 43, item 5), and the
restore of the same state from shared memory and from disk.

For each state size (parameters + optimiser state of an MLP trained with Adam, on the CPU or,
with `--device cuda`, on the GPU), every method saves the same state `--saves` times after one
warm-up save, and the table prints the median time training was blocked per save:

* `save_async`: brain_sdk's flash copy into a slot of shared memory (the agent's write-out to
  disk is not part of what training waits for, and is not run here);
* `sdk sync`: brain_sdk's synchronous checkpoint file (torch.save, fsync, rename, digest);
* `torch.save`: to a file, then fsync;
* `dcp.async_save`: torch.distributed.checkpoint.async_save, blocked until it returns (its
  staging copy); the background write is waited for before the next save.

Restore: the state read back from its shared-memory slot, and from its file on disk with the
page cache dropped first where this process may (root), else said, both through the SDK's own
readers (`flash.read_state`, and `flash.read_verified`, which checks the file's SHA-256 first as
a restore from disk does; the read alone is timed too); with `--device cuda`, each tensor made on
the GPU straight from the mapping, with the mapping page-locked for the copies and without.

    python benches/flash_checkpoint.py --gib 1 4 --dir /var/tmp/flash-bench
    python benches/flash_checkpoint.py --gib 1 4 --device cuda     # the state on the GPU

Needs torch and the SDK on PYTHONPATH (python/, with its generated stubs built).
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

from brain_sdk import checkpoint as ckpt
from brain_sdk import flash


def state_of(gib: float, device: str):
    """An MLP whose parameters and Adam state (two moments) come to about `gib` GiB, on `device`."""
    params = int(gib * (1 << 30) / 4 / 3)
    width = 4096
    layers = max(1, params // (width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, width, device=device)
    model(x).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": 1}


def nbytes(state) -> int:
    return sum(v.numel() * v.element_size() for v in flat(state))


def sync(device: str):
    """Waits for the GPU's queued work, so a time covers what it started there."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, saves: int, device: str):
    fn(0)  # warm-up: first-touch of pages, file creation
    times = []
    for i in range(1, saves + 1):
        sync(device)
        t = time.perf_counter()
        fn(i)
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def restored(read, device: str):
    """Seconds `read()` takes to give the state back on `device`, and its fields."""
    sync(device)
    t = time.perf_counter()
    state, fields = read()
    sync(device)
    took = time.perf_counter() - t
    where = {v.device.type for v in flat(state)}
    assert where == {torch.device(device).type}, f"restored onto {where}, not {device}"
    return took, fields


def flat(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from flat(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from flat(x)


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run(gib: float, disk: str, shm: str, saves: int, device: str, methods):
    state = state_of(gib, device)
    size = nbytes(state)
    rows = []
    store = flash.FlashStore(shm, 2 * size + (64 << 20))

    def save_async(i):
        r = store.save(state, step=i, rank=0, world=1, persist=True, incarnation=1, sdk={})
        # The agent would write it out; here it is marked written out so the slots cycle.
        flash._write_json(store.slot_file(r["slot"]) + ".json",
                          {**store.status(r["slot"]), "state": "persisted", "digest": "-"})

    rows.append(("save_async (flash)", timed(save_async, saves, device)))

    def sdk_sync(i):
        ckpt.write_atomic(os.path.join(disk, "sdk", f"state-{i % 2}.pt"), state)

    if "sdk" in methods:
        rows.append(("sdk sync checkpoint", timed(sdk_sync, saves, device)))
        shutil.rmtree(os.path.join(disk, "sdk"))

    def torch_save(i):
        path = os.path.join(disk, f"torch-{i % 2}.pt")
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    if "torch" in methods:
        rows.append(("torch.save + fsync", timed(torch_save, saves, device)))
        for i in range(2):
            os.unlink(os.path.join(disk, f"torch-{i}.pt"))

    try:
        if "dcp" not in methods:
            raise LookupError("not asked for")
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29541")
            dist.init_process_group("gloo", rank=0, world_size=1)
        pending = []

        def dcp_async(i):
            if pending:
                pending.pop().result()
            pending.append(dcp.async_save(state, checkpoint_id=os.path.join(disk, f"dcp-{i}")))

        rows.append(("dcp.async_save", timed(dcp_async, saves, device)))
        if pending:
            pending.pop().result()
    except LookupError:
        pass
    except Exception as e:  # noqa: BLE001 - the row says why it is missing
        rows.append((f"dcp.async_save: {type(e).__name__}: {e}", float("nan")))

    # Restore: the newest slot from memory, and the same bytes from disk, as the SDK restores
    # them (ElasticJob.restore): from memory as they are, from disk with the SHA-256 checked.
    slot = max(range(flash.SLOTS), key=lambda s: (store.status(s) or {}).get("save", 0))
    held = store.slot_file(slot)
    restores = {}
    if device.startswith("cuda"):
        # Through the driver's staging buffers, the mapping not page-locked.
        before = os.environ.get("BRAIN_FLASH_PIN")
        os.environ["BRAIN_FLASH_PIN"] = "0"
        try:
            restores["memory, not page-locked"] = restored(
                lambda: flash.read_state(held, device), device)[0]
        finally:
            # As the caller had it (page-locking on unless it said otherwise).
            if before is None:
                del os.environ["BRAIN_FLASH_PIN"]
            else:
                os.environ["BRAIN_FLASH_PIN"] = before
    took, fields = restored(lambda: flash.read_state(held, device), device)
    restores["memory" + (", page-locked" if fields["read_pinned"] else "")] = took
    on_disk = os.path.join(disk, "part-0.bin")
    shutil.copyfile(held, on_disk)
    digest = ckpt.sha256_of(on_disk)
    dropped = drop_caches()
    restores["disk, read only"] = restored(lambda: flash.read_state(on_disk, device), device)[0]
    drop_caches()
    restores["disk, SHA-256 checked (the SDK)"] = restored(
        lambda: flash.read_verified(on_disk, digest, device), device)[0]
    store.close()
    return size, rows, restores, dropped


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, nargs="+", default=[1.0])
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--dir", default=None, help="a directory on disk [default: a temporary one]")
    p.add_argument("--device", default="cpu",
                   help="where the state lives: cpu, or cuda (the GPU: saves copy it off the device, "
                        "restores put it back)")
    p.add_argument("--methods", nargs="+", default=["sdk", "torch", "dcp"],
                   choices=["sdk", "torch", "dcp"],
                   help="the methods set beside save_async (always measured) [default: all]")
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch {torch.__version__} sees no GPU")
    torch.set_num_threads(os.cpu_count() or 1)
    on = torch.cuda.get_device_name() if args.device.startswith("cuda") else "the CPU"
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, state on {on}, "
          f"median of {args.saves} saves after one warm-up")
    print(f"{'state':>9}  {'method':<24} {'blocked s':>10} {'s per GiB':>10}")
    for gib in args.gib:
        disk = tempfile.mkdtemp(prefix="flash-bench-", dir=args.dir)
        shm = tempfile.mkdtemp(prefix="flash-bench-", dir="/dev/shm")
        try:
            size, rows, restores, dropped = run(gib, disk, shm, args.saves, args.device, args.methods)
        finally:
            shutil.rmtree(disk, ignore_errors=True)
            shutil.rmtree(shm, ignore_errors=True)
        g = size / (1 << 30)
        for name, s in rows:
            print(f"{g:>7.2f} G  {name:<24} {s:>10.3f} {s / g:>10.3f}")
        cache = "page cache dropped" if dropped else "page cache NOT dropped (not root)"
        fastest = min(s for k, s in restores.items() if k.startswith("memory"))
        for name, s in restores.items():
            print(f"{g:>7.2f} G  restore from {name:<33} {s:>7.3f} s  "
                  f"({s / fastest:.1f}x the fastest from memory)")
        print(f"{g:>7.2f} G  (disk: {cache})")


if __name__ == "__main__":
    main()
