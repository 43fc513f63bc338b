"""A script that reads its own data and checkpoints with job.save_async (flash checkpoints): it
counts to --target, its state a tensor of --mib MiB filled with the count, saved every --every
counts. Each start appends {"rank", "world", "restart", "resumed", "from", "whole"} to --log
("from": where restore() read the state, "whole": every element of the tensor restored equals
the count restored with it); each save {"rank", "save", "blocked_s", "dropped"}."""

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
args = p.parse_args()


def log(entry):
    with open(args.log, "a") as f:
        f.write(json.dumps(entry) + "\n")


job = brain_sdk.ElasticJob(batch_size=1)
state = job.restore()
count = int(state["count"]) if state else 0
w = state["w"] if state else torch.zeros(args.mib * (1 << 20) // 4)
log({"rank": job.rank, "world": job.world_size, "restart": job.restart_count,
     "resumed": count, "from": job.restored_from, "whole": bool(torch.all(w == count))})
while count < args.target:
    count += 1
    w.fill_(count)
    job.step = count
    if count % args.every == 0:
        r = job.save_async({"count": count, "w": w})
        log({"rank": job.rank, "save": count, "blocked_s": r["blocked_s"], "dropped": r["dropped"]})
    time.sleep(args.sleep)
