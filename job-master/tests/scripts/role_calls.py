"""A job of roles calling each other through the SDK (job-master/tests/roles.rs).

`serve`: a `reward` engine: `score(x)` answers (its index, its incarnation, 2 * x).
`drive`: calls the reward role in each way every 0.1 s and appends one JSON line per round to
`--out`: {"all": [[index, incarnation, value], ...], "any": [...], "rank0": [...], and what a
failing method, a private one and a cycle of calls (`loop`) said}, or {"error": "..."} when a
call fails.
"""

import argparse
import json
import os
import sys
import time

import brain_sdk
from brain_sdk import roles


class Reward:
    def __init__(self):
        self.env = brain_sdk.ProcessEnv.from_env()

    def score(self, x):
        return [self.env.index, self.env.incarnation, 2 * x]

    def fail(self):
        raise ValueError("as asked")

    def loop(self):
        # Calls its own role's first member, which calls it again: a cycle the SDK refuses.
        return roles.group("reward", timeout=10).call("loop", how="rank0")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serve", "drive"])
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.mode == "serve":
        roles.serve(Reward())
        return 0
    reward = roles.group("reward", timeout=60)
    n = 0
    while True:
        n += 1
        try:
            line = {
                "all": reward.call("score", n, how="all"),
                "any": reward.call("score", n),
                "rank0": reward.call("score", x=n, how="rank0"),
            }
            try:
                reward.call("fail")
                line["remote_error"] = None
            except roles.RemoteError as e:
                line["remote_error"] = str(e)
            try:
                reward.call("_private")
            except brain_sdk.BrainError as e:
                line["private"] = str(e)
            try:
                reward.call("loop", how="rank0")
                line["cycle"] = None
            except brain_sdk.BrainError as e:
                line["cycle"] = str(e)
        except brain_sdk.BrainError as e:
            line = {"error": str(e)}
        with open(a.out, "a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
