"""A script that reads its own data and checkpoints with job.save_async (flash checkpoints): it
counts to --target, its state a tensor of --mib MiB filled with the count, saved every --every
counts. Each start appends {"rank", "world", "restart", "resumed", "from", "whole", "shard"} to
--log ("from": where restore() read the state, "whole": every element of the tensor restored
equals the count restored with it, "shard": the rank whose state it is); each save {"rank",
"save", "blocked_s", "dropped"}. With --sharded each rank's state is its own shard (its tensor
holds the count plus a million times its rank), saved with save_async(sharded=True)."""

import argparse
import json
import time

import torch

import brain_sdk

p = argparse.ArgumentParser()
p.add_argument("--target", type=int, required=True)
p.add_argument("--every", type=int, default=10)
p.add_argument("--mib", type=int, default=8)
p.add_argument("--sleep", type=float, default=0.01)
p.add_argument("--log", required=True)
p.add_argument("--sharded", action="store_true")
args = p.parse_args()


def log(entry):
    with open(args.log, "a") as f:
        f.write(json.dumps(entry) + "\n")


job = brain_sdk.ElasticJob(batch_size=1)
# A replicated state is the same on every rank; a shard is this rank's own.
base = job.rank * 1_000_000 if args.sharded else 0
state = job.restore()
count = int(state["count"]) if state else 0
w = state["w"] if state else torch.full((args.mib * (1 << 20) // 4,), float(base))
shard = int(state["rank"]) if state else job.rank
log({"rank": job.rank, "world": job.world_size, "restart": job.restart_count,
     "resumed": count, "from": job.restored_from, "shard": shard,
     "whole": bool(torch.all(w == count + base))})
while count < args.target:
    count += 1
    w.fill_(count + base)
    job.step = count
    if count % args.every == 0:
        r = job.save_async({"count": count, "w": w, "rank": job.rank}, sharded=args.sharded)
        log({"rank": job.rank, "save": count, "blocked_s": r["blocked_s"], "dropped": r["dropped"]})
    time.sleep(args.sleep)
