#!/usr/bin/env python3
"""A PyTorch DDP script that trains through brain_sdk: elastic in place, data read exactly once.

What the SDK (`pip install ./python`) gives it, run as an allreduce job with `rescale: in_place`
(`job.yaml` beside this file):

* data: each step's sample indices come from shards leased from the job master, reported done
  after the step that trained them: every sample once per epoch, through kill -9 and rescales;
* rescale in place: when a plan changes the number of workers, the group drains to a step
  boundary, rank 0 checkpoints, and the process group re-forms at the new size inside the
  running processes (their pids do not change); new ranks load that checkpoint;
* step, samples/s and loss go to the job master (and from there to the brain);
* checkpoints: written atomically with their SHA-256 and recorded by the job master; a process
  started after a failure resumes from the latest with `job.restore(peers=True)` (with flash
  memory, a rank whose node holds no copy of it gets the state from one that does).

The model runs on the GPU when one is present (gloo carries the gradients either way). The data
is a synthetic regression set of `--samples` samples (the job's `data.num_samples`), visited in a
fixed random order per epoch. `--events FILE` appends one JSON line per start, re-formation and
end of each process (pid, rank, world size), which the tests and the benchmark read.
"""

import argparse
import json
import logging
import os
import sys
import time

import torch
import torch.nn as nn

import brain_sdk
from brain_sdk.pytorch import ElasticDDP


def dataset(samples, features, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = x @ w + 0.01 * torch.randn(samples, 1, generator=g)
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=20000, help="the job's data.num_samples")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64, help="the hidden layer's width")
    p.add_argument("--batch-size", type=int, default=64, help="global, over every rank")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (tests)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--events", default="", help="append a JSON line per start/re-form/end")
    args = p.parse_args()
    # BRAIN_SDK_LOG=debug shows each step of a re-formation and checkpoint, with its time.
    logging.basicConfig(level=os.environ.get("BRAIN_SDK_LOG", "warning").upper(),
                        format="%(created).3f %(name)s: %(message)s")

    def event(kind, **fields):
        if args.events:
            line = {"event": kind, "pid": os.getpid(), "rank": job.rank,
                    "world": job.world_size, "step": job.step, "t": time.time(), **fields}
            with open(args.events, "a") as f:
                f.write(json.dumps(line) + "\n")

    # Everything slow comes before the job is joined: a process a plan adds starts while the
    # group trains on, and the group waits for it only from the moment it has joined.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = dataset(args.samples, args.features, args.seed)

    job = brain_sdk.ElasticJob(batch_size=args.batch_size)
    # Every rank restores here: a rank restarted where its node holds no flash copy gets the
    # state from a rank whose node does (peers=True), rather than from disk.
    state = job.restore(peers=True)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    job.save_with(lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()})
    ddp = ElasticDDP(job, model)
    # last_step: when this process finished its last step in the old group (the pause of a
    # re-formation runs from there to the first step in the new one).
    job.on_reform(lambda: event("reform", last_step=job.last_step_time))
    event("start", resumed=state is not None, device=str(device), restored_from=job.restored_from,
          flash_dir=job.env.flash_dir)

    orders = {}
    loss_fn = nn.MSELoss(reduction="sum")
    stepping_in = -1  # the group (count of re-formations) this process last logged a step in
    for batch in job.batches():
        order = orders.get(batch.epoch)
        if order is None:
            orders.clear()
            order = orders[batch.epoch] = torch.randperm(
                args.samples, generator=torch.Generator().manual_seed(args.seed + batch.epoch))
        idx = order[torch.tensor(batch.indices, dtype=torch.long)]
        xb, yb = x[idx].to(device), y[idx].to(device)
        opt.zero_grad()
        loss = loss_fn(ddp(xb), yb)
        (loss * batch.loss_scale).backward()
        opt.step()
        if batch.indices:
            job.report(loss.item() / len(batch.indices))
        if job.reforms != stepping_in:
            event("stepping")  # the first step trained in this group
            stepping_in = job.reforms
        if args.step_sleep:
            time.sleep(args.step_sleep)
    event("end", applied=job.applied_samples, evaluator=job.evaluator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
