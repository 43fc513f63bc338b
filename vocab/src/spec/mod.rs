//! The job spec: what a user writes (YAML, ElasticJob-like, DESIGN §4) and its validation.
//!
//! Parsing rejects unknown fields and wrong types with the field's path (`serde_path_to_error`);
//! [`JobSpec::validate`] then checks what types cannot say (counts, bounds, names), naming the
//! field path and the bad value, without touching the machine; [`host::check`] adds what only
//! the machine that runs the job can say (the program is executable, the checkpoint directory
//! can be created). Replicas and resources are optional: omitted means "the brain decides"; a
//! job master run without a brain falls back to the role's `min`.

pub mod env;
pub mod host;
pub mod limits;
mod placement;
mod platform;
mod precheck;
mod roles;
mod stability;
mod validate;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use placement::{DeviceShare, PlacementGroup, Strategy};
pub use platform::PlatformConfig;
pub use precheck::{Precheck, PrecheckSpec};
pub use roles::{Failover, Topology};
pub use stability::{StabilitySpec, StragglerAction};

use crate::error::{Error, SpecError};
use crate::role::{JobKind, Role};
use crate::units::{Bytes, Gpus, Millicores};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default, with = "crate::units::quantity::opt_cpu")]
    pub cpu: Option<Millicores>,
    #[serde(default, with = "crate::units::quantity::opt_memory")]
    pub memory: Option<Bytes>,
    /// GPUs per process: whole (`2`) or a share of one device (`0.4`, processes sharing it).
    pub gpu: Option<Gpus>,
    /// The GPU model the process needs (`V100`, `A100`, ...: Ray's `accelerator_type`); none:
    /// any. Needs `gpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Custom resources by name (a platform's own, e.g. Ray's `--resources`), amounts > 0.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, f64>,
}

/// One role group of the job: how many processes, how elastic, how big each is, and (for a
/// role outside the training group) what it runs; see `roles`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    /// Processes to start with; omitted means the brain decides (the master alone uses `min`).
    pub replicas: Option<i64>,
    pub min: Option<i64>,
    pub max: Option<i64>,
    /// Group size changes come in multiples of this (e.g. workers per node).
    pub node_unit: Option<i64>,
    pub resources: Option<Resources>,
    /// Relaunches allowed for this role before the job fails.
    pub max_restarts: Option<i64>,
    /// How its processes relate [default: the training group's for `worker` and `ps` (from
    /// `kind`), else `service`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// What restarts when one of its processes fails [default: `process` for services, single
    /// roles and a ps job's workers; `role` for parameter servers and an all-reduce group].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover: Option<Failover>,
    /// argv of a service or single role's program (the training roles run `workload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Extra environment of a service or single role's processes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// How a plan resizes a service role [default: `in_place`: only its own processes start
    /// or stop]. `restart`: every process of the job restarts at the new size (the training
    /// group from its latest checkpoint), for programs that cannot take a change of another
    /// role's membership (DLRover's unified controller resizes a role only this way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale: Option<Rescale>,
}

/// Settings of the built-in reference workload (a sparse CTR model on generated data).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuiltinWorkload {
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default = "default_fields")]
    pub num_fields: i64,
    #[serde(default = "default_vocab")]
    pub vocab_per_field: i64,
    #[serde(default = "default_buckets")]
    pub hash_buckets: i64,
    /// Global batch: per-worker batches are this divided by the number of workers (allreduce),
    /// or this for every worker (ps).
    #[serde(default = "default_batch")]
    pub batch_size: i64,
    #[serde(default = "default_lr")]
    pub learning_rate: f64,
    /// Extra compute per sample in microseconds, to make a small job last long enough to watch.
    #[serde(default)]
    pub step_delay_us: i64,
    /// allreduce: how the batch and the learning rate follow the number of workers when a
    /// plan changes it.
    #[serde(default)]
    pub batch_scaling: BatchScaling,
}

/// How an allreduce job's batch and learning rate follow the world size `n`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchScaling {
    /// `batch_size` is the global batch, split over the workers; the learning rate stays. The
    /// trained model does not depend on how often the job is rescaled.
    #[default]
    FixedGlobal,
    /// `batch_size` per worker (global `n × batch_size`), learning rate `n × learning_rate`
    /// (the linear scaling rule of Goyal et al., for SGD).
    Linear,
    /// `batch_size` per worker, learning rate `√n × learning_rate` (for adaptive optimisers
    /// such as the workload's Adagrad).
    Sqrt,
}

impl fmt::Display for BatchScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BatchScaling::FixedGlobal => "fixed_global",
            BatchScaling::Linear => "linear",
            BatchScaling::Sqrt => "sqrt",
        })
    }
}

fn default_seed() -> u64 {
    1
}
fn default_fields() -> i64 {
    8
}
fn default_vocab() -> i64 {
    1000
}
fn default_buckets() -> i64 {
    1 << 16
}
fn default_batch() -> i64 {
    256
}
fn default_lr() -> f64 {
    0.1
}

impl Default for BuiltinWorkload {
    fn default() -> Self {
        Self {
            seed: default_seed(),
            num_fields: default_fields(),
            vocab_per_field: default_vocab(),
            hash_buckets: default_buckets(),
            batch_size: default_batch(),
            learning_rate: default_lr(),
            step_delay_us: 0,
            batch_scaling: BatchScaling::default(),
        }
    }
}

/// What each training process runs: the built-in workload or a user command.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub builtin: Option<BuiltinWorkload>,
    /// argv of a user program, run with the torchrun environment and TF_CONFIG.
    pub command: Option<Vec<String>>,
    /// Extra environment for the training processes.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Time a training process gets between SIGTERM and SIGKILL when it must stop (a scale
    /// plan, a restart, the job's end), milliseconds [default: the job master's
    /// `--grace-period-ms`]. The contract for a command: on SIGTERM, save a checkpoint to
    /// `BRAIN_CHECKPOINT_DIR` and exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period_ms: Option<i64>,
    /// How a scale plan resizes a command's group [default: `restart`]. The built-in workload
    /// always re-forms in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale: Option<Rescale>,
}

/// How a command's group follows a scale plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rescale {
    /// TorchElastic's way, for any script: every process gets SIGTERM (its grace period to
    /// save and exit), then the group starts again at the new size with a new rank layout,
    /// `MASTER_PORT` and `TORCHELASTIC_RESTART_COUNT`.
    Restart,
    /// For scripts that train through the Python SDK (`python/`): at a consistent cut the
    /// SDK re-forms the process group at the new size inside the running processes;
    /// survivors keep their pid and memory, new ranks load the cut checkpoint.
    InPlace,
}

/// The longest grace period a spec may ask for: ten minutes.
pub const MAX_GRACE_PERIOD_MS: i64 = 600_000;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    pub num_samples: i64,
    pub shard_size: i64,
    /// Held-out samples (after the training ones) for the final evaluation.
    #[serde(default = "default_eval")]
    pub eval_samples: i64,
}

fn default_eval() -> i64 {
    10_000
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    pub dir: PathBuf,
    /// Take a checkpoint after this many shards are done (0: only at the start).
    #[serde(default = "default_every_shards")]
    pub every_shards: i64,
    /// Flash checkpoints (`job.save_async` in the SDK): shared memory on each training
    /// process's node, held by its agent, for at most two copies of its state [default: none,
    /// flash checkpoints off].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash: Option<FlashSpec>,
    /// Committed checkpoints kept on disk: once a newer one is committed (and recorded), the
    /// directories of those beyond the newest `keep` are deleted [default: every one kept].
    /// At least 1 (the one a restart resumes from); 2 or more leave a previous one to fall
    /// back on when the newest turns out damaged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
}

/// `checkpoint.flash`: how much shared memory each training process gets for its copies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlashSpec {
    /// Bytes for two copies of one process's state (e.g. `4Gi`: states up to 2 GiB) [from 1Mi
    /// to 1Ti].
    #[serde(with = "crate::units::quantity::opt_memory")]
    pub memory: Option<Bytes>,
}

impl FlashSpec {
    /// The budget in bytes (0 when unset).
    pub fn budget(&self) -> u64 {
        self.memory.map_or(0, |b| b.0)
    }
}

fn default_every_shards() -> i64 {
    20
}

/// A spec's roles, their names interned only once their count is within
/// [`limits::MAX_ROLES`]: a spec of thousands of role names is refused without keeping one.
fn roles_within_limit<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<Role, RoleSpec>, D::Error> {
    let named = BTreeMap::<String, RoleSpec>::deserialize(d)?;
    if named.len() > limits::MAX_ROLES {
        return Err(serde::de::Error::custom(format!(
            "roles: names {} roles, above the limit of {}",
            named.len(),
            limits::MAX_ROLES
        )));
    }
    named
        .into_iter()
        .map(|(name, spec)| Ok((Role::new(&name).map_err(serde::de::Error::custom)?, spec)))
        .collect()
}

/// A training job as a user submits it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub name: String,
    pub kind: JobKind,
    #[serde(deserialize_with = "roles_within_limit")]
    pub roles: BTreeMap<Role, RoleSpec>,
    pub workload: WorkloadSpec,
    pub data: DataSpec,
    #[serde(default = "default_epochs")]
    pub epochs: i64,
    pub checkpoint: CheckpointSpec,
    /// Where the job's processes run [default: local processes]; `job-master run --platform`
    /// overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<PlatformConfig>,
    /// Processes placed together or apart, each group reserved whole before its processes
    /// start (`placement::PlacementGroup`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<PlacementGroup>,
    /// When a training process is a straggler or hung, and what is done about a straggler.
    #[serde(default, skip_serializing_if = "StabilitySpec::is_default")]
    pub stability: StabilitySpec,
    /// The check each node runs before training (`precheck::PrecheckSpec`).
    #[serde(default, skip_serializing_if = "PrecheckSpec::is_default")]
    pub precheck: PrecheckSpec,
}

fn default_epochs() -> i64 {
    1
}

/// A role after validation: plain unsigned numbers, bounds resolved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolePlan {
    pub replicas: u32,
    pub min: u32,
    pub max: u32,
    pub node_unit: u32,
    pub max_restarts: u32,
}

impl JobSpec {
    /// Reads a spec file and validates it ([`JobSpec::validate`]; the checks that touch this
    /// machine are [`host::check`]). A relative checkpoint directory is taken relative to the
    /// file's directory.
    pub fn from_file(path: &Path) -> Result<JobSpec, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::SpecFile {
            path: path.to_path_buf(),
            source: e,
        })?;
        let mut spec = Self::from_yaml(&text).map_err(|e| e.in_file(path))?;
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if spec.checkpoint.dir.is_relative() {
            spec.checkpoint.dir = base.join(&spec.checkpoint.dir);
        }
        spec.validate().map_err(|e| e.in_file(path))?;
        Ok(spec)
    }

    /// Parses YAML, rejecting unknown fields and wrong types with the field's path, and
    /// aliases before anything is built ([`refuse_aliases`]).
    pub fn from_yaml(text: &str) -> Result<JobSpec, SpecError> {
        refuse_aliases(text)?;
        let de = serde_norway::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            // Map keys that are enums show as `?`; serde_norway's message names them.
            match inner.split_once(": ") {
                Some((p, rest)) if path.contains('?') && !p.contains(' ') => {
                    SpecError::new(p, rest)
                }
                _ => SpecError::new(if path == "." { "spec".into() } else { path }, inner),
            }
        })
    }

    pub fn shards_per_epoch(&self) -> u64 {
        (self.data.num_samples as u64).div_ceil(self.data.shard_size as u64)
    }
}

/// Refuses a YAML text with an alias (`*name`, also in a merge key `<<: *name`), read event by
/// event before any value is built: an alias repeats what its anchor names, so a spec of a
/// few kilobytes could otherwise expand to gigabytes ("billion laughs"). A text the event
/// reader cannot read is refused with its reason.
pub fn refuse_aliases(text: &str) -> Result<(), SpecError> {
    use yaml_rust2::parser::{Event, Parser};
    let mut parser = Parser::new_from_str(text);
    loop {
        match parser.next_token() {
            Ok((Event::StreamEnd, _)) => return Ok(()),
            Ok((Event::Alias(_), mark)) => {
                return Err(SpecError::new(
                    "spec",
                    format!(
                        "line {}, column {}: a YAML alias (*name): aliases are not accepted in a \
                         job spec (each repeats what its anchor names, so a small spec could \
                         expand without bound); write the value out",
                        mark.line(),
                        mark.col() + 1
                    ),
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(SpecError::new("spec", format!("not YAML: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name: ctr
kind: ps
roles:
  ps: { replicas: 2 }
  worker: { replicas: 3, min: 1, max: 4, resources: { cpu: "500m", memory: 1Gi } }
workload:
  builtin: { batch_size: 128 }
data: { num_samples: 1000, shard_size: 100 }
epochs: 2
checkpoint: { dir: /tmp/brain-spec-test }
"#;

    /// A spec of more roles than a job may have is refused before any of their names is kept:
    /// refused specs cannot fill the process's table of role names.
    #[test]
    fn a_spec_of_too_many_roles_is_refused_without_keeping_their_names() {
        let many: String = (0..limits::MAX_ROLES + 1)
            .map(|i| format!("  flood-{i}: {{ replicas: 1 }}\n"))
            .collect();
        let yaml = GOOD.replace(
            "  ps: { replicas: 2 }\n",
            &format!("  ps: {{ replicas: 2 }}\n{many}"),
        );
        let e = JobSpec::from_yaml(&yaml).unwrap_err().to_string();
        assert!(e.contains("above the limit of 64"), "{e}");
        assert!((0..=limits::MAX_ROLES).all(|i| !Role::is_known(&format!("flood-{i}"))));
        // Within the limit, they are kept.
        let few = GOOD.replace(
            "  ps: { replicas: 2 }\n",
            "  ps: { replicas: 2 }\n  kept-1: { replicas: 1 }\n",
        );
        let _ = JobSpec::from_yaml(&few);
        assert!(Role::is_known("kept-1"));
    }

    #[test]
    fn good_spec_parses_units_and_bounds() {
        let spec = JobSpec::from_yaml(GOOD).unwrap();
        spec.validate().unwrap();
        let w = spec.role_plan(Role::WORKER).unwrap();
        assert_eq!((w.replicas, w.min, w.max, w.node_unit), (3, 1, 4, 1));
        let res = spec.roles[&Role::WORKER].resources.clone().unwrap();
        assert_eq!(res.cpu, Some(Millicores(500)));
        assert_eq!(res.memory, Some(Bytes(1 << 30)));
        assert_eq!(spec.shards_per_epoch(), 10);
    }

    #[test]
    fn the_platform_and_custom_resources_come_from_the_spec() {
        let yaml = GOOD.replace(
            "memory: 1Gi }",
            "memory: 1Gi, custom: { brain_slot: 1.5 } }",
        ) + "platform: { type: ray, address: \"http://127.0.0.1:8265\", env: { A: b } }\n";
        let spec = JobSpec::from_yaml(&yaml).unwrap();
        spec.validate().unwrap();
        let res = spec.roles[&Role::WORKER].resources.clone().unwrap();
        assert_eq!(res.custom.get("brain_slot"), Some(&1.5));
        match spec.platform {
            Some(PlatformConfig::Ray { address, env, .. }) => {
                assert_eq!(address, "http://127.0.0.1:8265");
                assert_eq!(env.get("A").map(String::as_str), Some("b"));
            }
            other => panic!("{other:?}"),
        }
        assert!(JobSpec::from_yaml(GOOD).unwrap().platform.is_none());
        assert!(
            err(&(GOOD.to_string() + "platform: { type: ray, adress: x }\n"))
                .contains("unknown field `adress`")
        );
        assert!(err(&(GOOD.to_string() + "platform: { type: slurm }\n")).contains("slurm"));
        assert!(
            err(&GOOD.replace("memory: 1Gi }", "memory: 1Gi, custom: { CPU: 1 } }"))
                .contains("roles.worker.resources.custom.CPU: is not a custom resource name")
        );
        assert!(
            err(&GOOD.replace("memory: 1Gi }", "memory: 1Gi, custom: { slot: 0 } }"))
                .contains("roles.worker.resources.custom.slot: 0 must be more than zero")
        );
    }

    #[test]
    fn a_gpu_type_names_a_model_and_needs_gpus() {
        let with = |extra: &str| GOOD.replace("memory: 1Gi }", &format!("memory: 1Gi, {extra} }}"));
        let spec = JobSpec::from_yaml(&with("gpu: 2, gpu_type: A100")).unwrap();
        spec.validate().unwrap();
        let res = spec.roles[&Role::WORKER].resources.clone().unwrap();
        assert_eq!(
            (res.gpu, res.gpu_type.as_deref()),
            (Some(Gpus::whole(2)), Some("A100"))
        );
        assert!(
            err(&with("gpu_type: A100"))
                .contains("roles.worker.resources.gpu_type: \"A100\" needs a gpu above 0")
        );
        // A share of one device, or whole devices: never 1.5.
        let spec = JobSpec::from_yaml(&with("gpu: 0.4")).unwrap();
        spec.validate().unwrap();
        let res = spec.roles[&Role::WORKER].resources.clone().unwrap();
        assert_eq!(res.gpu, Some(Gpus::from_milli(400)));
        assert!(err(&with("gpu: 1.5")).contains(
            "roles.worker.resources.gpu: 1.5: a process shares a device only for less than one GPU"
        ));
        assert!(err(&with("gpu: 1, gpu_type: \"A 100\"")).contains("is not a GPU model name"));
    }

    #[test]
    fn a_grace_period_is_bounded() {
        let with = |g: &str| {
            GOOD.replace(
                "batch_size: 128 }",
                &format!("batch_size: 128 }}\n  grace_period_ms: {g}"),
            )
        };
        let spec = JobSpec::from_yaml(&with("30000")).unwrap();
        spec.validate().unwrap();
        assert_eq!(spec.workload.grace_period_ms, Some(30_000));
        assert_eq!(
            err(&with("-1")),
            "workload.grace_period_ms: -1 is outside 0 to 600000 (ten minutes)"
        );
        assert!(err(&with("600001")).contains("outside 0 to 600000"));
    }

    #[test]
    fn rescale_in_place_is_for_allreduce_commands() {
        let ps_cmd = GOOD.replace(
            "builtin: { batch_size: 128 }",
            "command: [python3, train.py]\n  rescale: in_place",
        );
        assert!(err(&ps_cmd).starts_with("workload.rescale: in_place is for allreduce jobs"));
        let cmd = ps_cmd
            .replace("kind: ps", "kind: allreduce")
            .replace("  ps: { replicas: 2 }\n", "");
        let spec = JobSpec::from_yaml(&cmd).unwrap();
        spec.validate().unwrap();
        assert_eq!(spec.workload.rescale, Some(Rescale::InPlace));
        assert!(
            err(&cmd.replace("in_place", "sideways"))
                .contains("unknown variant `sideways`, expected `restart` or `in_place`")
        );
        assert_eq!(
            err(&GOOD.replace(
                "builtin: { batch_size: 128 }",
                "builtin: { batch_size: 128 }\n  rescale: restart"
            )),
            "workload.rescale: applies to a command: the built-in workload always re-forms in place"
        );
    }

    #[test]
    fn roles_are_named_groups_with_a_topology_a_failover_level_and_their_own_program() {
        let rl = GOOD.replace("kind: ps", "kind: allreduce").replace(
            "  ps: { replicas: 2 }\n",
            "  rollout: { replicas: 2, max: 4, command: [python3, rollout.py], env: { A: b } }\n  \
             driver: { topology: single, failover: job, command: [drive] }\n",
        );
        let spec = JobSpec::from_yaml(&rl).unwrap();
        spec.validate().unwrap();
        let (rollout, driver) = (Role::new("rollout").unwrap(), Role::new("driver").unwrap());
        assert_eq!(spec.topology(Role::WORKER), Topology::Allreduce);
        assert_eq!(spec.topology(rollout), Topology::Service);
        assert_eq!(spec.topology(driver), Topology::Single);
        assert_eq!(spec.failover(Role::WORKER), Failover::Role);
        assert_eq!(spec.failover(rollout), Failover::Process);
        assert_eq!(spec.failover(driver), Failover::Job);
        assert_eq!(
            spec.service_roles().collect::<Vec<_>>(),
            vec![driver, rollout]
        );
        let paths: Vec<String> = spec.commands().into_iter().map(|(p, _)| p).collect();
        assert_eq!(paths, ["roles.driver.command", "roles.rollout.command"]);
        // A ps job's roles keep their meaning.
        let ps = JobSpec::from_yaml(GOOD).unwrap();
        assert_eq!(ps.topology(Role::PS), Topology::Ps);
        assert_eq!(ps.failover(Role::WORKER), Failover::Process);
        assert_eq!(ps.failover(Role::PS), Failover::Role);

        for (bad, want) in [
            (
                rl.replace("command: [python3, rollout.py], ", ""),
                "roles.rollout.command: is missing: a service role runs its own program",
            ),
            (
                rl.replace("topology: single, ", "topology: single, replicas: 2, "),
                "roles.driver.replicas: a single role has exactly one process",
            ),
            (
                rl.replace("max: 4, command", "topology: ps, max: 4, command"),
                "roles.rollout.topology: ps: parameter servers need workers that read them",
            ),
            (
                rl.replace(
                    "max: 4, command: [python3, rollout.py], env: { A: b }",
                    "topology: allreduce, max: 4",
                ),
                "roles.rollout.topology: allreduce: a job has one training group, and worker \
                 is it",
            ),
            (
                rl.replace(
                    "worker: { replicas: 3",
                    "worker: { failover: process, replicas: 3",
                ),
                "roles.worker.failover: process: one member of an all-reduce group cannot",
            ),
            (
                rl.replace(
                    "worker: { replicas: 3",
                    "worker: { topology: service, replicas: 3",
                ),
                "roles.worker.topology: service: the worker role of a allreduce job is the \
                 training group's (allreduce)",
            ),
            (
                rl.replace(
                    "worker: { replicas: 3",
                    "worker: { command: [x], replicas: 3",
                ),
                "roles.worker.command: is for service and single roles",
            ),
            (
                rl.replace(
                    "worker: { replicas: 3",
                    "worker: { rescale: restart, replicas: 3",
                ),
                "roles.worker.rescale: is for service and single roles",
            ),
            (
                rl.replace("env: { A: b }", "env: { BRAIN_ROLE: x }"),
                "roles.rollout.env.BRAIN_ROLE: is the runtime's to set",
            ),
            (
                rl.replace("env: { A: b }", "env: { A: \"b\\0c\" }"),
                "roles.rollout.env.A: holds a NUL byte",
            ),
            (rl.replace("rollout: {", "Rollout: {"), "role name"),
            (
                rl.replace("failover: job", "failover: sometimes"),
                "unknown variant `sometimes`",
            ),
            (
                GOOD.replace(
                    "ps: { replicas: 2 }",
                    "ps: { replicas: 2, failover: process }",
                ),
                "roles.ps.failover: process: a parameter server holds model state",
            ),
        ] {
            let e = err(&bad);
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn the_all_reduce_group_is_named_freely() {
        let actor = GOOD.replace("kind: ps", "kind: allreduce").replace(
            "  ps: { replicas: 2 }\n  worker: { replicas: 3",
            "  rollout: { replicas: 2, command: [python3, rollout.py] }\n  \
             actor: { topology: allreduce, replicas: 3",
        );
        let spec = JobSpec::from_yaml(&actor).unwrap();
        spec.validate().unwrap();
        let (a, rollout) = (Role::new("actor").unwrap(), Role::new("rollout").unwrap());
        assert_eq!(spec.training_role(), a);
        assert!(spec.is_training(a) && !spec.is_training(rollout));
        assert_eq!(spec.failover(a), Failover::Role);
        assert_eq!(spec.service_roles().collect::<Vec<_>>(), vec![rollout]);
        // A `worker` beside it is one more role, with a program of its own.
        let beside = actor.replace(
            "  rollout:",
            "  worker: { topology: service, command: [w] }\n  rollout:",
        );
        let spec = JobSpec::from_yaml(&beside).unwrap();
        spec.validate().unwrap();
        assert_eq!(spec.training_role(), a);
        assert_eq!(spec.topology(Role::WORKER), Topology::Service);
        // A ps job's and a plain allreduce job's training group is `worker`.
        assert_eq!(
            JobSpec::from_yaml(GOOD).unwrap().training_role(),
            Role::WORKER
        );

        // A further all-reduce group runs a program of its own (a critic trained apart): it
        // is outside the training group, restarts whole, and is allowed in a ps job too.
        let further = actor.replace(
            "command: [python3",
            "topology: allreduce, command: [python3",
        );
        let spec = JobSpec::from_yaml(&further).unwrap();
        spec.validate().unwrap();
        assert_eq!(spec.training_role(), a);
        assert!(!spec.is_training(rollout));
        assert_eq!(spec.topology(rollout), Topology::Allreduce);
        assert_eq!(spec.failover(rollout), Failover::Role);
        assert_eq!(spec.service_roles().collect::<Vec<_>>(), vec![rollout]);
        let ps = GOOD.replace(
            "  ps: {",
            "  critic: { topology: allreduce, command: [c] }\n  ps: {",
        );
        let spec = JobSpec::from_yaml(&ps).unwrap();
        spec.validate().unwrap();
        assert!(!spec.is_training(Role::new("critic").unwrap()));

        for (bad, want) in [
            (
                actor.replace(
                    "rollout: { replicas: 2, command: [python3, rollout.py] }",
                    "rollout: { replicas: 2, topology: allreduce }",
                ),
                "roles.rollout.topology: allreduce: a job has one training group, and actor is \
                 it (a `worker` role without a topology is the group); give rollout a \
                 `command` of its own to make it a further all-reduce group",
            ),
            (
                actor.replace("  rollout:", "  worker: { replicas: 2 }\n  rollout:"),
                "roles.actor.topology: allreduce: a job has one training group, and worker is it",
            ),
            (
                further.replace(
                    "topology: allreduce, command: [python3",
                    "topology: allreduce, failover: process, command: [python3",
                ),
                "roles.rollout.failover: process: one member of an all-reduce group cannot",
            ),
            (
                actor.replace("topology: allreduce, ", ""),
                "roles.worker: is missing: every job needs workers (a `worker` role, or in an \
                 allreduce job one role with `topology: allreduce` that runs the workload",
            ),
            (
                GOOD.replace("  ps: {", "  actor: { topology: allreduce }\n  ps: {"),
                "roles.actor.topology: allreduce: a ps job's training group is its `ps` and \
                 `worker` roles",
            ),
            (
                actor.replace(
                    "replicas: 3, min: 1",
                    "failover: process, replicas: 3, min: 1",
                ),
                "roles.actor.failover: process: one member of an all-reduce group cannot",
            ),
            (
                // An all-reduce group with a program of its own is a further group: the
                // training group is then missing.
                actor.replace("replicas: 3, min: 1", "command: [x], replicas: 3, min: 1"),
                "roles.worker: is missing: every job needs workers",
            ),
        ] {
            let e = err(&bad);
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }

    #[test]
    fn omitted_replicas_fall_back_to_min() {
        let spec = JobSpec::from_yaml(&GOOD.replace("replicas: 3, min: 1", "min: 2")).unwrap();
        assert_eq!(spec.role_plan(Role::WORKER).unwrap().replicas, 2);
    }

    fn err(yaml: &str) -> String {
        match JobSpec::from_yaml(yaml) {
            Err(e) => e.to_string(),
            Ok(s) => s.validate().unwrap_err().to_string(),
        }
    }

    #[test]
    fn errors_name_the_field_path_and_value() {
        assert!(
            err(&GOOD.replace("epochs: 2", "epochs: 2\nepoch: 3"))
                .contains("unknown field `epoch`")
        );
        assert!(
            err(&GOOD.replace("batch_size: 128", "batch_size: 128, lr: 1"))
                .contains("workload.builtin")
        );
        assert!(
            err(&GOOD.replace("min: 1, max: 4", "min: 5, max: 4"))
                .contains("roles.worker.min: 5 is greater than max 4")
        );
        assert!(
            err(&GOOD.replace("shard_size: 100", "shard_size: -3")).contains("data.shard_size: -3")
        );
        assert!(
            err(&GOOD.replace("cpu: \"500m\"", "cpu: lots"))
                .contains("roles.worker.resources: cpu quantity \"lots\"")
        );
        let keep = |n: &str| {
            GOOD.replace(
                "checkpoint: { dir: /tmp/brain-spec-test }",
                &format!("checkpoint: {{ dir: /tmp/brain-spec-test, keep: {n} }}"),
            )
        };
        assert!(err(&keep("0")).contains("checkpoint.keep: 0 would delete the checkpoint"));
        let spec = JobSpec::from_yaml(&keep("3")).unwrap();
        spec.validate().unwrap();
        assert_eq!(spec.checkpoint.keep, Some(3));
    }

    #[test]
    fn quantities_parse_like_kubernetes_and_read_back() {
        let r = |yaml: &str| serde_norway::from_str::<Resources>(yaml);
        assert_eq!(r("{cpu: 1.5}").unwrap().cpu, Some(Millicores(1500)));
        assert_eq!(r("{cpu: 2}").unwrap().cpu, Some(Millicores(2000)));
        assert_eq!(r("{cpu: \"250m\"}").unwrap().cpu, Some(Millicores(250)));
        assert_eq!(r("{memory: 512Mi}").unwrap().memory, Some(Bytes(512 << 20)));
        assert_eq!(
            r("{memory: 2G}").unwrap().memory,
            Some(Bytes(2_000_000_000))
        );
        assert!(r("{memory: two}").is_err());
        assert!(r("{cpu: -1}").is_err());
        let res = r("{cpu: 0.5, memory: 1Gi, gpu: 1}").unwrap();
        let text = serde_norway::to_string(&res).unwrap();
        assert_eq!(r(&text).unwrap(), res, "{text}");
        assert_eq!(r("{}").unwrap(), Resources::default());
    }
}
