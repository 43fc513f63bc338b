#!/usr/bin/env python3
"""Reference solver for the allocation LP instances in datasets/data/lp_instances.

Solves max-sum throughput and heterogeneity-aware max-min fairness with cvxpy + ECOS and prints
`policy,instance,objective,wall_seconds` (instance: the file name without .json) (wall = problem build + solve), so a Rust solver can be
compared side by side in one run on the same machine.

Needs: pip install numpy cvxpy ecos
usage: lp_reference.py INSTANCE.json [INSTANCE.json ...]
"""
import json
import os
import sys
import time

import cvxpy as cp
import numpy as np


def solve(inst, policy):
    M = np.array([j["throughput"] for j in inst["jobs"]], float)
    s = np.array([j["scale_factor"] for j in inst["jobs"]], float)
    cap = np.array(inst["capacity"], float)
    t0 = time.perf_counter()
    x = cp.Variable(M.shape)
    cons = [x >= 0,
            cp.sum(cp.multiply(s[:, None] * np.ones_like(M), x), axis=0) <= cap,
            cp.sum(x, axis=1) <= 1]
    if policy == "max_sum_throughput":
        objective = cp.Maximize(cp.sum(cp.multiply(M, x)))
    else:
        prop = M @ (cap / cap.sum())
        W = M / prop[:, None] * s[:, None]
        objective = cp.Maximize(cp.min(cp.sum(cp.multiply(W, x), axis=1)))
    problem = cp.Problem(objective, cons)
    problem.solve(solver="ECOS")
    return problem.value, time.perf_counter() - t0


def main():
    print("policy,instance,objective,wall_seconds")
    for path in sys.argv[1:]:
        inst = json.load(open(path))
        name = os.path.basename(path).removesuffix(".json")
        for policy in ("max_sum_throughput", "max_min_fairness"):
            value, wall = solve(inst, policy)
            print(f"{policy},{name},{value:.6f},{wall:.4f}", flush=True)


if __name__ == "__main__":
    main()
