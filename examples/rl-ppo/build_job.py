#!/usr/bin/env python3
"""The job of job.yaml, written with the SDK's JobBuilder. From the repository root:

    python3 examples/rl-ppo/build_job.py --dry-run      # print the spec
    python3 examples/rl-ppo/build_job.py                # run it with a local job master
    python3 examples/rl-ppo/build_job.py --brain URL    # submit it to a brain
"""

import argparse
import sys

from brain_sdk import JobBuilder

HERE = "examples/rl-ppo/rl.py"


def job(updates: int = 40, log: str = "runs/rl-ppo/returns.jsonl") -> JobBuilder:
    return (
        JobBuilder("rl-ppo", kind="allreduce")
        .role("actor")
        .topology("allreduce")
        .run(["python3", HERE, "train", "--updates", str(updates), "--log", log])
        .total(2)
        .max_restarts(3)
        .env(OMP_NUM_THREADS="1")
        .role("rollout").run(f"{HERE}:RolloutEngine").total(2).min(1).max(4)
        .env(OMP_NUM_THREADS="1")
        .role("reward").run(f"{HERE}:Reward")
        .role("critic").topology("single").run(f"{HERE}:Critic")
        .env(OMP_NUM_THREADS="1")
        .data(num_samples=1, shard_size=1)
        .checkpoint("runs/rl-ppo/checkpoints")
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="print the spec and stop")
    p.add_argument("--brain", default="", help="submit to this brain instead of running here")
    a = p.parse_args()
    j = job()
    if a.dry_run:
        j.dry_run()
    elif a.brain:
        j.submit(brain=a.brain)
    else:
        j.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
