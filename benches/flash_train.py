"""The training process of `benches/benches/flash_pytorch.rs`: an MLP trained with Adam on
--device (the CPU, or a GPU: `cuda`), its parameters and optimiser state about --gib GiB, on the job master's data through
brain_sdk's `batches()`, so its checkpoints are taken at the master's consistent cuts (through
flash memory when the job has `checkpoint.flash`, else synchronously to disk).

One JSON line per event to --log:

* `start`: pid, rank, restart, restored_from, restore_s (the time `job.restore()` took, the state
  back on the device), flash_dir;
* `step`: s (the step's own time: forward, backward, optimiser, waited for on a GPU), writing
  (this process's agent
  was writing a copy of its state out when the step began or ended), rank and world (the
  group's size at that step);
* `cut`: rank, step, held ("memory" or "disk"), blocked_s (the time the cut held this rank).
"""

import argparse
import json
import os
import time

import torch

import brain_sdk

p = argparse.ArgumentParser()
p.add_argument("--gib", type=float, default=1.0)
p.add_argument("--log", required=True)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--device", default="cpu")
p.add_argument(
    "--ddp",
    action="store_true",
    help="train through brain_sdk.pytorch.ElasticDDP (a group of several ranks; with the job's "
    "`rescale: in_place`, it may grow and shrink in place)",
)
args = p.parse_args()
on_gpu = args.device.startswith("cuda")


def sync():
    """Waits for the GPU's queued work, so a time covers what it started there."""
    if on_gpu:
        torch.cuda.synchronize()


def log(entry):
    with open(args.log, "a") as f:
        f.write(json.dumps({"t": time.time(), **entry}) + "\n")


WIDTH = 4096
layers = max(1, int(args.gib * (1 << 30) / 4 / 3) // (WIDTH * WIDTH))
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)])
model = model.to(args.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
x = torch.randn(args.batch_size, WIDTH, device=args.device)

job = brain_sdk.ElasticJob(batch_size=args.batch_size)
sync()
began = time.perf_counter()
# Every rank restores here: one whose node lost its copy gets it from a rank that holds one.
state = job.restore(device=args.device, peers=True)
sync()
restore_s = time.perf_counter() - began
if state is not None:
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
else:
    # Adam's moments exist from the first step on: take one so that every cut saves them.
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
job.save_with(lambda: {"model": model.state_dict(), "optim": opt.state_dict()})
if args.ddp:
    from brain_sdk.pytorch import ElasticDDP

    net = ElasticDDP(job, model)
else:
    net = model
flash_dir = job.env.flash_dir or ""
log({"event": "start", "pid": os.getpid(), "rank": job.rank, "restart": job.restart_count,
     "restored_from": job.restored_from, "restore_s": restore_s, "flash_dir": flash_dir,
     "device": str(x.device)})


def writing() -> bool:
    """Whether this process's agent is writing one of its copies out now."""
    if not flash_dir:
        return False
    for slot in range(2):
        try:
            with open(os.path.join(flash_dir, f"slot-{slot}.json")) as f:
                if json.load(f).get("state") == "persisting":
                    return True
        except (OSError, ValueError):
            pass
    return False


seen_cut = None
for batch in job.batches():
    w = writing()
    sync()
    t = time.perf_counter()
    net(x).sum().backward()
    opt.step()
    opt.zero_grad()
    sync()
    s = time.perf_counter() - t
    log({"event": "step", "s": s, "writing": w or writing(), "rank": job.rank,
         "world": job.world_size})
    if job.last_cut is not None and job.last_cut is not seen_cut:
        seen_cut = job.last_cut
        log({"event": "cut", "rank": job.rank, **seen_cut})
