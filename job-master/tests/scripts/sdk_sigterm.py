"""A script that reads its own data and uses brain_sdk only for its checkpoints: it counts to
--target, saving its count on SIGTERM (job.save_on_sigterm) and resuming from it. Each start
appends {"rank", "world", "restart", "resumed"} to --starts."""

import argparse
import json
import time

import brain_sdk

p = argparse.ArgumentParser()
p.add_argument("--target", type=int, required=True)
p.add_argument("--starts", required=True)
args = p.parse_args()

job = brain_sdk.ElasticJob(batch_size=1)
state = job.restore()
count = state["count"] if state else 0
job.save_with(lambda: {"count": count})
job.save_on_sigterm()
with open(args.starts, "a") as f:
    f.write(json.dumps({"rank": job.rank, "world": job.world_size,
                        "restart": job.restart_count, "resumed": count}) + "\n")
while count < args.target:
    count += 1
    time.sleep(0.01)
