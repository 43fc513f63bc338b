#!/usr/bin/env python3
"""A small reinforcement-learning job of four roles, in real PyTorch, that learns.

The environment (written here): a corridor of `CELLS` cells. An episode starts in cell 0; each
step moves left or right; reaching the last cell ends it with reward +1; every step costs 0.02;
an episode ends after `MAX_STEPS` steps anyway. A random policy's average return is about 0; the
best policy's is 1 - 0.02 * (CELLS - 1).

The roles (`job.yaml` beside this file, or `build_job.py` with the SDK's JobBuilder):

* `actor` (the training group, all-reduce, 2 ranks: `topology: allreduce`). Each update it pushes its
  policy weights to every rollout engine, asks the engines for episodes, asks the critic for
  state values, and takes PPO steps (clipped objective) whose gradients DDP averages over the
  ranks (gloo). Rank 0 then fits the critic to the episodes' returns, saves a checkpoint, and
  logs the update. A restarted group resumes from that checkpoint.
* `rollout` (service, 2-4 replicas): generates episodes with the weights last pushed to it; the
  rewards of each episode come from the reward role.
* `reward` (service): the reward model, here the corridor's rule.
* `critic` (single): the value network V(s), fitted to returns.

Every call between roles goes through `brain_sdk.roles` (the job's secret, and TLS when the job
runs with it); callers follow the roles as they are resized and restarted.

    python3 rl.py train --updates 40 --log returns.jsonl   # the actor (workload.command)
    python3 -m brain_sdk.roles rl:RolloutEngine           # a rollout engine (and so on)
"""

import argparse
import json
import os
import random
import sys
import time

import torch
import torch.nn as nn

CELLS = 8
MAX_STEPS = 16
STEP_COST = 0.02
GAMMA = 0.99


def one_hot(cell: int) -> list:
    v = [0.0] * CELLS
    v[cell] = 1.0
    return v


def policy_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(CELLS, 32), nn.Tanh(), nn.Linear(32, 2))


def value_net() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(CELLS, 32), nn.Tanh(), nn.Linear(32, 1))


class Corridor:
    """The environment: the cell after a move, and whether the episode ended."""

    @staticmethod
    def step(cell: int, action: int) -> "tuple[int, bool]":
        cell = max(0, min(CELLS - 1, cell + (1 if action == 1 else -1)))
        return cell, cell == CELLS - 1


class Reward:
    """The reward model: the reward of each (cell after the move, ended) of an episode."""

    def score(self, steps):
        return [(1.0 if done else 0.0) - STEP_COST for _, done in steps]


class Critic:
    """V(s): values of states, fitted to observed returns."""

    def __init__(self):
        self.net = value_net()
        self.opt = torch.optim.Adam(self.net.parameters(), lr=0.01)

    def values(self, states):
        with torch.no_grad():
            return self.net(torch.tensor(states)).squeeze(-1).tolist()

    def fit(self, states, returns, steps=20):
        x, y = torch.tensor(states), torch.tensor(returns)
        for _ in range(steps):
            loss = ((self.net(x).squeeze(-1) - y) ** 2).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return float(loss)


class RolloutEngine:
    """Generates episodes with the policy weights the actor last pushed."""

    def __init__(self):
        from brain_sdk import roles

        self.policy = policy_net()
        self.version = 0
        self.rng = random.Random(os.getpid())
        self.reward = roles.group("reward")

    def set_weights(self, version, state):
        self.policy.load_state_dict(state)
        self.version = version
        return version

    def episodes(self, n):
        out = []
        for _ in range(n):
            cell, states, actions, logps, steps = 0, [], [], [], []
            for _ in range(MAX_STEPS):
                s = one_hot(cell)
                with torch.no_grad():
                    dist = torch.distributions.Categorical(logits=self.policy(torch.tensor(s)))
                    a = int(dist.sample())
                    logp = float(dist.log_prob(torch.tensor(a)))
                cell, done = Corridor.step(cell, a)
                states.append(s)
                actions.append(a)
                logps.append(logp)
                steps.append((cell, done))
                if done:
                    break
            rewards = self.reward.call("score", steps)
            out.append(
                {"states": states, "actions": actions, "logps": logps, "rewards": rewards}
            )
        return {"version": self.version, "episodes": out}


def returns_of(rewards):
    g, out = 0.0, []
    for r in reversed(rewards):
        g = r + GAMMA * g
        out.append(g)
    return out[::-1]


def train(args) -> int:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from brain_sdk import roles

    from brain_sdk.env import gloo_on_node_address

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Ranks on other nodes reach this one at its node's address (not what the host name
    # resolves to, 127.0.0.1 in a container or network namespace).
    gloo_on_node_address()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    policy = policy_net()
    start = 0
    ckpt = os.path.join(os.environ.get("BRAIN_CHECKPOINT_DIR", "."), "actor.pt")
    if os.path.exists(ckpt):
        saved = torch.load(ckpt)
        policy.load_state_dict(saved["policy"])
        start = saved["update"]
    model = DDP(policy)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rollout, critic = roles.group("rollout", timeout=120), roles.group("critic", timeout=120)
    def log(line):
        if rank == 0 and args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps({**line, "at": round(time.time(), 3), "pid": os.getpid()}) + "\n")

    for update in range(start, args.updates):
        began = time.monotonic()
        log({"begin": update + 1})
        version = update + 1
        weights = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        engines = len(rollout.call("set_weights", version, weights, how="all"))
        batch = []
        while len(batch) < args.episodes:
            got = rollout.call("episodes", args.episodes_per_call)
            if got["version"] == version:
                batch.extend(got["episodes"])
            else:
                # On-policy only: an engine started (or restarted) since the push gets the
                # weights again.
                engines = len(rollout.call("set_weights", version, weights, how="all"))
        states = [s for e in batch for s in e["states"]]
        rets = [g for e in batch for g in returns_of(e["rewards"])]
        values = critic.call("values", states)
        x = torch.tensor(states)
        a = torch.tensor([a for e in batch for a in e["actions"]])
        old = torch.tensor([lp for e in batch for lp in e["logps"]])
        adv = torch.tensor(rets) - torch.tensor(values)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        for _ in range(args.ppo_steps):
            logp = torch.distributions.Categorical(logits=model(x)).log_prob(a)
            ratio = (logp - old).exp()
            loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        avg = torch.tensor([sum(e["rewards"]) for e in batch]).mean()
        dist.all_reduce(avg)
        avg = float(avg) / world
        if rank == 0:
            critic.call("fit", states, rets)
            tmp = ckpt + ".tmp"
            torch.save({"policy": policy.state_dict(), "update": update + 1}, tmp)
            os.replace(tmp, ckpt)
            log(
                {
                    "update": update + 1,
                    "return": round(avg, 4),
                    "engines": engines,
                    "seconds": round(time.monotonic() - began, 3),
                }
            )
        if args.update_sleep:
            time.sleep(args.update_sleep)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train", help="the actor: the job's training group")
    t.add_argument("--updates", type=int, default=40)
    t.add_argument("--episodes", type=int, default=16, help="episodes per rank per update")
    t.add_argument("--episodes-per-call", type=int, default=4)
    t.add_argument("--ppo-steps", type=int, default=4)
    t.add_argument("--lr", type=float, default=0.02)
    t.add_argument("--update-sleep", type=float, default=0.0, help="seconds (tests)")
    t.add_argument(
        "--log",
        default="",
        help="append JSON lines (rank 0): {begin: N} as update N starts, then its return",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    try:
        return train(args)
    except Exception:
        # Said in the log too: on a cluster the process's own output is on another node.
        if args.log:
            import traceback

            with open(args.log, "a") as f:
                line = {"error": traceback.format_exc(), "rank": os.environ.get("RANK")}
                f.write(json.dumps(line) + "\n")
        raise


if __name__ == "__main__":
    sys.exit(main())
