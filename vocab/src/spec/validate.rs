//! [`JobSpec::validate`]: what the types of a spec cannot say (counts and bounds, names,
//! limits, the workload's settings, variables a job may not set), said with the field's path
//! and the bad value, without looking at the machine (that is [`super::host`]).

use super::{JobSpec, MAX_GRACE_PERIOD_MS, Rescale, Resources, RolePlan, limits};
use crate::error::SpecError;
use crate::role::{JobKind, Role};
use crate::units::{Bytes, Gpus, Millicores};

impl JobSpec {
    /// Checks everything the types cannot, without looking at this machine (the program and
    /// the checkpoint directory are `host::check`'s). The first problem found is returned.
    pub fn validate(&self) -> Result<(), SpecError> {
        limits::dns_label(&self.name).map_err(|e| SpecError::new("name", e))?;
        if !self.roles.contains_key(&self.training_role()) {
            return Err(SpecError::new(
                "roles.worker",
                "is missing: every job needs workers (a `worker` role, or in an allreduce job \
                 one role with `topology: allreduce` that runs the workload: no `command` of \
                 its own)",
            ));
        }
        match (self.kind, self.roles.contains_key(&Role::PS)) {
            (JobKind::Ps, false) => {
                return Err(SpecError::new(
                    "roles.ps",
                    "is missing: a ps job needs parameter servers",
                ));
            }
            (JobKind::Allreduce, true) => {
                return Err(SpecError::new(
                    "roles.ps",
                    "is not allowed in an allreduce job",
                ));
            }
            _ => {}
        }
        for role in self.roles.keys() {
            self.role_plan(*role)?;
        }
        self.validate_roles()?;
        self.validate_placement()?;
        self.validate_stability()?;
        self.validate_precheck()?;
        self.validate_workload()?;
        positive("data.num_samples", self.data.num_samples)?;
        limits::at_most(
            "data.num_samples",
            self.data.num_samples,
            limits::MAX_SAMPLES,
        )?;
        positive("data.shard_size", self.data.shard_size)?;
        positive("epochs", self.epochs)?;
        limits::at_most("epochs", self.epochs, limits::MAX_EPOCHS)?;
        let shards = self.shards_per_epoch() * self.epochs as u64;
        if shards > limits::MAX_SHARDS {
            return Err(SpecError::new(
                "data.shard_size",
                format!(
                    "{} is too small for {} samples over {} epochs: {shards} shards in all, above \
                     the limit of {}",
                    self.data.shard_size,
                    self.data.num_samples,
                    self.epochs,
                    limits::MAX_SHARDS
                ),
            ));
        }
        non_negative("data.eval_samples", self.data.eval_samples)?;
        limits::at_most(
            "data.eval_samples",
            self.data.eval_samples,
            limits::MAX_EVAL_SAMPLES,
        )?;
        non_negative("checkpoint.every_shards", self.checkpoint.every_shards)?;
        if self.checkpoint.keep == Some(0) {
            return Err(SpecError::new(
                "checkpoint.keep",
                "0 would delete the checkpoint a restart resumes from: keep at least 1",
            ));
        }
        if let Some(f) = &self.checkpoint.flash {
            const MIB: u64 = 1 << 20;
            let b = f.budget();
            if !(MIB..=MIB << 20).contains(&b) {
                return Err(SpecError::new(
                    "checkpoint.flash.memory",
                    format!("{b} bytes is out of range: from 1Mi to 1Ti"),
                ));
            }
        }
        Ok(())
    }

    fn validate_workload(&self) -> Result<(), SpecError> {
        super::roles::check_env("workload.env", &self.workload.env)?;
        if let Some(g) = self.workload.grace_period_ms
            && !(0..=MAX_GRACE_PERIOD_MS).contains(&g)
        {
            return Err(SpecError::new(
                "workload.grace_period_ms",
                format!("{g} is outside 0 to {MAX_GRACE_PERIOD_MS} (ten minutes)"),
            ));
        }
        match (self.workload.rescale, &self.workload.builtin, self.kind) {
            (Some(_), Some(_), _) => {
                return Err(SpecError::new(
                    "workload.rescale",
                    "applies to a command: the built-in workload always re-forms in place",
                ));
            }
            (Some(Rescale::InPlace), None, JobKind::Ps) => {
                return Err(SpecError::new(
                    "workload.rescale",
                    "in_place is for allreduce jobs (the SDK re-forms a torch.distributed \
                     group); a ps command restarts at the new size",
                ));
            }
            _ => {}
        }
        match (&self.workload.builtin, &self.workload.command) {
            (None, None) => Err(SpecError::new(
                "workload",
                "names no command: set workload.command (argv) or workload.builtin",
            )),
            (Some(_), Some(_)) => Err(SpecError::new(
                "workload",
                "sets both builtin and command: choose one",
            )),
            // Whether the program runs here is the host's check (`host::check`).
            (None, Some(cmd)) => super::roles::check_command("workload.command", cmd),
            (Some(b), None) => {
                positive("workload.builtin.num_fields", b.num_fields)?;
                positive("workload.builtin.vocab_per_field", b.vocab_per_field)?;
                positive("workload.builtin.hash_buckets", b.hash_buckets)?;
                positive("workload.builtin.batch_size", b.batch_size)?;
                non_negative("workload.builtin.step_delay_us", b.step_delay_us)?;
                for (field, v, max) in [
                    ("num_fields", b.num_fields, limits::MAX_FIELDS),
                    (
                        "vocab_per_field",
                        b.vocab_per_field,
                        limits::MAX_VOCAB_PER_FIELD,
                    ),
                    ("hash_buckets", b.hash_buckets, limits::MAX_HASH_BUCKETS),
                    ("batch_size", b.batch_size, limits::MAX_BATCH),
                    ("step_delay_us", b.step_delay_us, limits::MAX_STEP_DELAY_US),
                ] {
                    limits::at_most(&format!("workload.builtin.{field}"), v, max)?;
                }
                if !(b.learning_rate.is_finite() && b.learning_rate > 0.0) {
                    return Err(SpecError::new(
                        "workload.builtin.learning_rate",
                        format!("{} must be a positive number", b.learning_rate),
                    ));
                }
                if u32::try_from(b.num_fields).is_err() {
                    return Err(SpecError::new(
                        "workload.builtin.num_fields",
                        format!("{} is too large", b.num_fields),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The validated numbers of one role.
    pub fn role_plan(&self, role: Role) -> Result<RolePlan, SpecError> {
        let r = self
            .roles
            .get(&role)
            .ok_or_else(|| SpecError::new(format!("roles.{role}"), "is missing"))?;
        let p = |field: &str| format!("roles.{role}.{field}");
        let node_unit = match r.node_unit {
            Some(n) => to_count(&p("node_unit"), n)?,
            None => 1,
        };
        let min = match r.min {
            Some(n) => to_count(&p("min"), n)?,
            None => r
                .replicas
                .map(|n| to_count(&p("replicas"), n))
                .transpose()?
                .unwrap_or(node_unit),
        };
        let max = match r.max {
            Some(n) => to_count(&p("max"), n)?,
            None => r
                .replicas
                .map(|n| to_count(&p("replicas"), n))
                .transpose()?
                .unwrap_or(min)
                .max(min),
        };
        if min > max {
            return Err(SpecError::new(
                p("min"),
                format!("{min} is greater than max {max}"),
            ));
        }
        if max % node_unit != 0 {
            return Err(SpecError::new(
                p("max"),
                format!("{max} is not a multiple of node_unit {node_unit}"),
            ));
        }
        let replicas = match r.replicas {
            Some(n) => to_count(&p("replicas"), n)?,
            None => min,
        };
        if replicas < min || replicas > max {
            return Err(SpecError::new(
                p("replicas"),
                format!("{replicas} is outside [min {min}, max {max}]"),
            ));
        }
        if replicas % node_unit != 0 {
            return Err(SpecError::new(
                p("replicas"),
                format!("{replicas} is not a multiple of node_unit {node_unit}"),
            ));
        }
        let max_restarts = match r.max_restarts {
            Some(n) if n < 0 => {
                return Err(SpecError::new(
                    p("max_restarts"),
                    format!("{n} must not be negative"),
                ));
            }
            Some(n) => {
                limits::at_most(&p("max_restarts"), n, limits::MAX_RESTARTS)?;
                n as u32
            }
            None => 3,
        };
        if let Some(res) = &r.resources {
            check_resources(&p, res)?;
        }
        Ok(RolePlan {
            replicas,
            min,
            max,
            node_unit,
            max_restarts,
        })
    }
}

/// The resources of one process of a role (`p` makes a field's path): positive, below the
/// limits, a GPU model only with GPUs, custom resources named and positive.
fn check_resources(p: &dyn Fn(&str) -> String, res: &Resources) -> Result<(), SpecError> {
    if res.cpu == Some(Millicores(0)) {
        return Err(SpecError::new(
            p("resources.cpu"),
            "0 must be more than zero",
        ));
    }
    if let Some(Millicores(m)) = res.cpu {
        limits::at_most_u64(&p("resources.cpu"), m, limits::MAX_CPU_MILLICORES, "m")?;
    }
    if let Some(Bytes(b)) = res.memory {
        limits::at_most_u64(
            &p("resources.memory"),
            b,
            limits::MAX_MEMORY_BYTES,
            " bytes",
        )?;
    }
    if let Some(g) = res.gpu {
        if g > Gpus::whole(limits::MAX_GPUS) {
            return Err(SpecError::new(
                p("resources.gpu"),
                format!("{g} is above the limit of {}", limits::MAX_GPUS),
            ));
        }
        if g > Gpus::ONE && !g.is_whole() {
            return Err(SpecError::new(
                p("resources.gpu"),
                format!(
                    "{g}: a process shares a device only for less than one GPU; above one, \
                     ask for whole GPUs"
                ),
            ));
        }
    }
    if let Some(t) = &res.gpu_type {
        if res.gpu.unwrap_or_default().is_zero() {
            return Err(SpecError::new(
                p("resources.gpu_type"),
                format!("{t:?} needs a gpu above 0"),
            ));
        }
        if t.is_empty()
            || !t
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(SpecError::new(
                p("resources.gpu_type"),
                format!("{t:?} is not a GPU model name (letters, digits, - _ .)"),
            ));
        }
    }
    for (name, amount) in &res.custom {
        let at = p(&format!("resources.custom.{name}"));
        if name.is_empty() || matches!(name.as_str(), "CPU" | "GPU" | "memory") {
            return Err(SpecError::new(
                at,
                "is not a custom resource name (CPU, GPU and memory have their own fields)",
            ));
        }
        if !(amount.is_finite() && *amount > 0.0) {
            return Err(SpecError::new(
                at,
                format!("{amount} must be more than zero"),
            ));
        }
    }
    Ok(())
}

fn positive(path: &str, v: i64) -> Result<(), SpecError> {
    if v <= 0 {
        return Err(SpecError::new(
            path,
            format!("{v} must be greater than zero"),
        ));
    }
    Ok(())
}

fn non_negative(path: &str, v: i64) -> Result<(), SpecError> {
    if v < 0 {
        return Err(SpecError::new(path, format!("{v} must not be negative")));
    }
    Ok(())
}

fn to_count(path: &str, v: i64) -> Result<u32, SpecError> {
    if v <= 0 {
        return Err(SpecError::new(
            path,
            format!("{v} must be greater than zero"),
        ));
    }
    limits::at_most(path, v, limits::MAX_REPLICAS)?;
    u32::try_from(v).map_err(|_| SpecError::new(path, format!("{v} is too large")))
}
