#!/usr/bin/env python3
"""TensorFlow 2 ParameterServerStrategy over TF_CONFIG, as a Brain ps job's command.

Every task runs this script. `TF_CONFIG` (written by the worker agent) says which task it is:

* `ps` and `worker` tasks start a `tf.distribute.Server` and serve until they are stopped;
* the `chief` (Brain's worker 0) is the coordinator: it builds the model's variables on the
  parameter servers, schedules training steps on the workers with a `ClusterCoordinator`, saves
  a checkpoint to `BRAIN_CHECKPOINT_DIR` every `--checkpoint-every` steps and on SIGTERM, resumes
  from the latest one on start, and exits 0 when it has trained `--steps` steps. The job succeeds
  when the chief does.

The model is a linear regression on synthetic data, written without Keras (TF's Keras 3 does
not support ParameterServerStrategy): variables, a `tf.function` step and plain SGD.

Run it from the repository root with `job-master run examples/tf-ps/job.yaml`.
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

STOP = False


def on_sigterm(signum, frame):
    global STOP
    STOP = True


def log(task, text):
    print(f"[{task}] {text}", flush=True)


def serve(task_type, task_index, cluster):
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=task_type, task_index=task_index,
        protocol="grpc", start=True)
    log(f"{task_type} {task_index}", "serving")
    server.join()


def coordinate(args):
    ckpt_dir = os.environ.get("BRAIN_CHECKPOINT_DIR", "checkpoints")
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    features = args.features
    true_w = tf.random.stateless_normal([features, 1], seed=[args.seed, 0])

    with strategy.scope():
        w = tf.Variable(tf.zeros([features, 1]), name="w")
        b = tf.Variable(0.0, name="b")
        step = tf.Variable(0, dtype=tf.int64, name="step")

    ckpt = tf.train.Checkpoint(w=w, b=b, step=step)
    manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=2)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint)
        log("chief", f"resumed from step {int(step.numpy())}")
        with open(os.path.join(ckpt_dir, "resumes.jsonl"), "a") as f:
            f.write(json.dumps({"step": int(step.numpy()), "restart": int(restarts)}) + "\n")

    def dataset_fn():
        x = tf.random.stateless_normal([4096, features], seed=[args.seed, 1])
        y = tf.matmul(x, true_w)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(args.batch_size)

    per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(per_worker)

    @tf.function
    def train_step(it):
        x, y = next(it)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(args.lr * gw)
        b.assign_sub(args.lr * gb)
        step.assign_add(1)
        return loss

    log("chief", f"training from step {int(step.numpy())} to {args.steps} "
        f"(restart {restarts})")
    started = time.time()
    loss = None
    while int(step.numpy()) < args.steps:
        if STOP:
            manager.save()
            log("chief", f"SIGTERM: checkpoint at step {int(step.numpy())}; exiting")
            return 0
        for _ in range(args.schedule):
            loss = coordinator.schedule(train_step, args=(iterator,))
        coordinator.join()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        n = int(step.numpy())
        if n % args.checkpoint_every < args.schedule:
            manager.save()
            log("chief", f"step {n} loss {loss.fetch():.6f} "
                f"({n / max(time.time() - started, 1e-9):.1f} steps/s)")
    manager.save()
    final = float(loss.fetch()) if loss is not None else float("nan")
    with open(os.path.join(ckpt_dir, "done.json"), "w") as f:
        json.dump({"step": int(step.numpy()), "loss": final}, f)
    log("chief", f"done: step {int(step.numpy())}, loss {final:.6f}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--schedule", type=int, default=20, help="steps scheduled per round")
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per round (tests)")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config["task"]
    if task["type"] in ("ps", "worker"):
        serve(task["type"], task["index"], tf_config["cluster"])
        return 0
    signal.signal(signal.SIGTERM, on_sigterm)
    return coordinate(args)


if __name__ == "__main__":
    sys.exit(main())
