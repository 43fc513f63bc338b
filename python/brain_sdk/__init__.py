"""brain_sdk: train a script elastically under Brain's job master.

    import brain_sdk
    from brain_sdk.pytorch import ElasticDDP

    job = brain_sdk.ElasticJob(batch_size=256)           # from the agent's environment
    state = job.restore()                                 # the cut checkpoint, or None
    ...build model and optimiser, load `state` into them...
    job.save_with(lambda: {"model": model.state_dict(), "opt": opt.state_dict()})
    ddp = ElasticDDP(job, model)
    for batch in job.batches():                           # one step per batch
        x, y = X[batch.indices], Y[batch.indices]
        loss = loss_fn(ddp(x), y, reduction="sum") * batch.loss_scale
        opt.zero_grad(); loss.backward(); opt.step()
        job.report(loss.item() / batch.world_size)

Run it as a job's `workload.command` with `rescale: in_place` (allreduce jobs) and the job's
`data.num_samples` set to the data set's size. What the job gets:

* data: shards leased from the job master and reported done after the step that used them,
  so every sample is trained once per epoch through kill -9 and rescales (`job.py`);
* in-place rescale: at a step boundary the group re-forms at the new size; survivors keep
  their pid and memory, new ranks load the checkpoint of the cut (`pytorch.py`);
* step, samples/s and loss reported to the job master, which forwards them to the brain;
* checkpoints written atomically with their SHA-256, recorded in the job master's manifest,
  loaded by `restore()` (`checkpoint.py`).

The SDK logs what it does to the `brain_sdk` logger (`logging`): DEBUG shows each step of a
re-formation and checkpoint with its time.

Calls between the roles of a job (a trainer asking rollout engines for episodes, a reward
model scoring them): `brain_sdk.roles.serve(obj)` in the callee, `brain_sdk.roles.group(name)
.call(method, ...)` in the caller (`roles.py`).

A job of several roles can be written in Python instead of YAML: `brain_sdk.JobBuilder`
(`builder.py`) builds the same spec, prints it, validates it, submits it to a brain or runs it
with a local job master.

Modules: `env` (who this process is), `master` (gRPC calls, stubs generated from proto/ at
build time into `_gen`), `job`, `checkpoint`, `pytorch`, `roles`, `builder`, `errors`.
"""

from .builder import JobBuilder
from .env import ProcessEnv
from .errors import BrainError, CheckpointDamaged, Refused
from .job import Batch, ElasticJob

__all__ = [
    "Batch",
    "BrainError",
    "CheckpointDamaged",
    "ElasticJob",
    "JobBuilder",
    "ProcessEnv",
    "Refused",
]
__version__ = "0.1.0"
