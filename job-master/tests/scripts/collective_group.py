"""A further all-reduce group's process (job-master/tests/roles.rs): a role with `topology:
allreduce` and this program of its own, beside the job's training group.

It serves calls (`value(x)` answers its index, incarnation and 2 * x), forms its group with
`brain_sdk.roles.collective()`, restores the group's checkpoint (`restore()`: its step and the
total of its sums), has rank 1 call rank 0 once (`how="rank0"`), then all-reduces its rank + 1
every 0.2 s, one step each, checkpointing the group every `--every` steps (none while the file
`--hold` exists: the ranks agree on it by an all-reduce), appending one JSON
line per all-reduce to `--out`: {"index", "incarnation", "pid", "rank", "world", "sum",
"step", "total", "restored", "called"} (`restored`: the step restored at the start, or null;
`called` on rank 1's first line: what rank 0 answered).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import brain_sdk
from brain_sdk import roles


class Critic:
    def __init__(self):
        self.env = brain_sdk.ProcessEnv.from_env()

    def value(self, x):
        return [self.env.index, self.env.incarnation, 2 * x]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--hold", default=None)
    args = p.parse_args()
    env = brain_sdk.ProcessEnv.from_env()
    roles.serve(Critic(), block=False)
    g = roles.collective(timeout=120)
    restored = g.restore()
    step, total = (restored[0], restored[1]["total"]) if restored else (0, 0.0)
    if restored and restored[1]["step"] != step:
        raise SystemExit(f"restored state of step {restored[1]['step']} for step {step}")
    called = None
    if g.rank == 1:
        called = roles.group(env.role, timeout=60).call("value", 21, how="rank0")
    while True:
        t = torch.tensor([float(g.rank + 1)])
        dist.all_reduce(t)
        step += 1
        total += t.item()
        if step % args.every == 0:
            hold = torch.tensor([float(bool(args.hold) and os.path.exists(args.hold))])
            dist.all_reduce(hold, op=dist.ReduceOp.MAX)
            if hold.item() == 0:
                g.checkpoint(step, {"step": step, "total": total})
        line = {
            "index": env.index,
            "incarnation": env.incarnation,
            "pid": os.getpid(),
            "rank": g.rank,
            "world": g.world_size,
            "sum": t.item(),
            "step": step,
            "total": total,
            "restored": restored[0] if restored else None,
        }
        if called is not None:
            line["called"] = called
            called = None
        with open(args.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(0.2)


if __name__ == "__main__":
    main()
