#!/usr/bin/env python3
"""A plain PyTorch DDP training script, elastic the TorchElastic way.

It knows nothing of Brain beyond the environment every elastic launcher gives (torchrun's
variables, and `BRAIN_CHECKPOINT_DIR` for where checkpoints go):

* `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`: the process group (gloo; the model runs on
  the GPU when one is present, on the CPU otherwise).
* `TORCHELASTIC_RESTART_COUNT`: how many times the group restarted (printed).
* On start it loads the latest checkpoint, if any, and goes on from the epoch and the position
  in the epoch it records, whatever the new world size.
* Rank 0 saves a checkpoint every `--checkpoint-every` steps and, on SIGTERM, at the next step
  boundary, then every rank exits 0: the contract a job master relies on when it rescales a job
  by restarting it (SIGTERM, a grace period, then SIGKILL).

Data: a synthetic regression set of `--samples` samples, shuffled per epoch with a fixed seed;
each step consumes one global batch (`--batch-size` per rank, in rank order), so the position in
an epoch is the number of samples consumed and survives a change of world size.

Run it from the repository root with `job-master run examples/pytorch-ddp/job-plain.yaml`.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

STOP = False


def on_sigterm(signum, frame):
    global STOP
    STOP = True


def log(rank, text):
    print(f"[rank {rank}] {text}", flush=True)


def dataset(samples, features, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = x @ w + 0.01 * torch.randn(samples, 1, generator=g)
    return x, y


def model_for(features):
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 1))


def checkpoint_path(directory):
    return os.path.join(directory, "checkpoint.pt")


def load(directory):
    path = checkpoint_path(directory)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def save(directory, state):
    """Atomic: a reader sees the old checkpoint or the new one, never half of one."""
    os.makedirs(directory, exist_ok=True)
    tmp = checkpoint_path(directory) + ".tmp"
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, checkpoint_path(directory))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (tests)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--first-step-log", default="",
                   help="append when this process finished its first step (benchmarks)")
    args = p.parse_args()

    signal.signal(signal.SIGTERM, on_sigterm)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ckpt_dir = os.environ.get("BRAIN_CHECKPOINT_DIR", "checkpoints")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    log(rank, f"world {world}, restart {restarts}, device {device}, "
        f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")

    torch.manual_seed(args.seed)
    model = model_for(args.features).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    epoch, pos, step = 0, 0, 0
    state = load(ckpt_dir)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        epoch, pos, step = state["epoch"], state["pos"], state["step"]
        log(rank, f"resumed from step {step} (epoch {epoch}, position {pos})")
        if rank == 0:
            with open(os.path.join(ckpt_dir, "resumes.jsonl"), "a") as f:
                f.write(json.dumps({"step": step, "epoch": epoch, "pos": pos,
                                    "world": world, "restart": restarts}) + "\n")
    ddp = nn.parallel.DistributedDataParallel(model)
    x, y = dataset(args.samples, args.features, args.seed)
    loss_fn = nn.MSELoss()

    def snapshot():
        return {"model": model.state_dict(), "optimizer": opt.state_dict(),
                "epoch": epoch, "pos": pos, "step": step, "world": world}

    global_batch = args.batch_size * world
    started = time.time()
    while epoch < args.epochs:
        order = torch.randperm(args.samples, generator=torch.Generator().manual_seed(args.seed + epoch))
        while pos + global_batch <= args.samples:
            if STOP:
                if rank == 0:
                    save(ckpt_dir, snapshot())
                    log(rank, f"SIGTERM: checkpoint at step {step}; exiting")
                dist.destroy_process_group()
                return 0
            idx = order[pos + rank * args.batch_size: pos + (rank + 1) * args.batch_size]
            xb, yb = x[idx].to(device), y[idx].to(device)
            try:
                opt.zero_grad()
                loss = loss_fn(ddp(xb), yb)
                loss.backward()
            except RuntimeError as e:
                # A peer left mid-step (it was stopped, or died): this step did not happen, and
                # the model is still the one every rank had after the last step, so rank 0
                # saves it. Exit 0 when asked to stop, 1 otherwise (the launcher restarts all).
                if rank == 0:
                    save(ckpt_dir, snapshot())
                log(rank, f"the group broke at step {step}: {str(e).splitlines()[0]}")
                return 0 if STOP else 1
            opt.step()
            pos += global_batch
            step += 1
            if args.first_step_log:
                with open(args.first_step_log, "a") as f:
                    f.write(json.dumps({"rank": rank, "world": world, "restart": restarts,
                                        "t": time.time()}) + "\n")
                args.first_step_log = ""
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if step % args.checkpoint_every == 0 and rank == 0:
                save(ckpt_dir, snapshot())
            if step % 50 == 0:
                rate = step / max(time.time() - started, 1e-9)
                log(rank, f"step {step} epoch {epoch} loss {loss.item():.5f} ({rate:.1f} steps/s)")
        epoch, pos = epoch + 1, 0
    if rank == 0:
        save(ckpt_dir, snapshot())
        with open(os.path.join(ckpt_dir, "done.json"), "w") as f:
            json.dump({"step": step, "epoch": epoch, "world": world, "loss": loss.item()}, f)
        log(rank, f"done: {epoch} epochs, step {step}, loss {loss.item():.5f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
