//! The job's `precheck:` settings: the check every node the job may use runs before training.
//!
//! One check process per node (torch, in the job's Python) times a square matmul of
//! `matmul_size` (the **compute** check), then the nodes all-reduce `allreduce_mb` in pairs,
//! twice: in order first, then the slowest of the first round with the fastest, and a node that
//! failed or sat out with one that passed (the **communication** check, NCCL between GPU nodes,
//! gloo otherwise, as DLRover's node check does). A node that fails every round it is in is
//! **faulty**; one whose matmul, or each of whose rounds, took `straggler_ratio` times the
//! median or more is a **straggler**. The job avoids both and starts on the healthy nodes.
//!
//! On by default for a command (a torch script) that asks for a GPU, off otherwise (the
//! built-in workload computes on the CPU).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::JobSpec;
use crate::error::SpecError;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrecheckSpec {
    /// Run the check [default: on when a role asks for a GPU and the workload is a command].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The side of the square matrices multiplied [default: 1024; from 64 to 16384].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_size: Option<u32>,
    /// The size each pair all-reduces, MiB [default: 16; from 1 to 4096].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce_mb: Option<u32>,
    /// A node this many times slower than the median is a straggler [default: 2; from 1.2 to
    /// 100].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straggler_ratio: Option<f64>,
    /// How long each step of the check (start and matmul, each round) may take before the nodes
    /// that have not answered count as failed, seconds [default: 120; from 5 to 3600].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_timeout_s: Option<u32>,
    /// The Python (with torch and the brain SDK) the check runs in [default: the workload
    /// command's interpreter when it is one, else `python3`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
}

/// `precheck:` with every default resolved, for one job.
#[derive(Clone, Debug, PartialEq)]
pub struct Precheck {
    pub matmul_size: u32,
    pub allreduce_mb: u32,
    pub straggler_ratio: f64,
    pub step_timeout_s: u32,
    pub python: String,
}

impl PrecheckSpec {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl JobSpec {
    /// Whether any role's processes ask for a GPU.
    pub fn uses_gpu(&self) -> bool {
        self.roles.keys().any(|r| !self.gpu_of(*r).is_zero())
    }

    /// The pre-run check this job runs, defaults resolved; `None` when it runs none.
    pub fn precheck(&self) -> Option<Precheck> {
        let p = &self.precheck;
        // The built-in workload computes on the CPU in Rust: nothing for a torch check to vouch
        // for.
        let default = self.uses_gpu() && self.workload.command.is_some();
        if !p.enabled.unwrap_or(default) {
            return None;
        }
        let python = p.python.clone().unwrap_or_else(|| {
            self.workload
                .command
                .as_ref()
                .and_then(|c| c.first())
                .filter(|c| {
                    Path::new(c.as_str())
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("python"))
                })
                .cloned()
                .unwrap_or_else(|| "python3".into())
        });
        Some(Precheck {
            matmul_size: p.matmul_size.unwrap_or(1024),
            allreduce_mb: p.allreduce_mb.unwrap_or(16),
            straggler_ratio: p.straggler_ratio.unwrap_or(2.0),
            step_timeout_s: p.step_timeout_s.unwrap_or(120),
            python,
        })
    }

    /// Checks `precheck:`: each number in its range, a Python that is named.
    pub(super) fn validate_precheck(&self) -> Result<(), SpecError> {
        let p = &self.precheck;
        for (field, v, lo, hi) in [
            ("matmul_size", p.matmul_size.map(f64::from), 64.0, 16_384.0),
            ("allreduce_mb", p.allreduce_mb.map(f64::from), 1.0, 4096.0),
            ("straggler_ratio", p.straggler_ratio, 1.2, 100.0),
            (
                "step_timeout_s",
                p.step_timeout_s.map(f64::from),
                5.0,
                3600.0,
            ),
        ] {
            if let Some(v) = v
                && !(lo..=hi).contains(&v)
            {
                return Err(SpecError::new(
                    format!("precheck.{field}"),
                    format!("{v} is out of range: from {lo} to {hi}"),
                ));
            }
        }
        if p.python.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(SpecError::new(
                "precheck.python",
                "is empty: name the Python interpreter (with torch) the check runs in",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: &str) -> Result<JobSpec, SpecError> {
        let text = format!(
            "name: j\nkind: allreduce\nroles: {{worker: {{replicas: 2}}}}\n\
             workload: {{command: [/opt/venv/bin/python3.12, train.py]}}\n\
             data: {{num_samples: 100, shard_size: 10}}\ncheckpoint: {{dir: /tmp/c}}\n{extra}"
        );
        let s = JobSpec::from_yaml(&text)?;
        s.validate()?;
        Ok(s)
    }

    #[test]
    fn the_check_is_on_for_gpu_jobs_and_off_for_cpu_ones_unless_said() {
        assert_eq!(spec("").unwrap().precheck(), None);
        let s = spec("precheck: {enabled: true}").unwrap();
        let p = s.precheck().unwrap();
        assert_eq!(p.python, "/opt/venv/bin/python3.12");
        assert_eq!((p.matmul_size, p.allreduce_mb), (1024, 16));
        assert_eq!(p.straggler_ratio, 2.0);
        let mut gpu = spec("").unwrap();
        gpu.roles.get_mut(&crate::Role::WORKER).unwrap().resources = Some(crate::spec::Resources {
            gpu: Some(crate::Gpus::whole(1)),
            ..Default::default()
        });
        assert!(gpu.precheck().is_some());
        gpu.precheck.enabled = Some(false);
        assert_eq!(gpu.precheck(), None);
        // The built-in workload's GPU jobs are not checked unless asked.
        gpu.precheck.enabled = None;
        gpu.workload.command = None;
        gpu.workload.builtin = Some(Default::default());
        assert_eq!(gpu.precheck(), None);
    }

    #[test]
    fn its_settings_are_range_checked_with_the_field() {
        let e = spec("precheck: {matmul_size: 10}").unwrap_err();
        assert_eq!(e.path, "precheck.matmul_size", "{e}");
        assert!(e.to_string().contains("from 64 to 16384"), "{e}");
        let e = spec("precheck: {straggler_ratio: 1.0}").unwrap_err();
        assert_eq!(e.path, "precheck.straggler_ratio", "{e}");
        let e = spec("precheck: {step_timeout_s: 1}").unwrap_err();
        assert_eq!(e.path, "precheck.step_timeout_s", "{e}");
        let e = spec("precheck: {python: ' '}").unwrap_err();
        assert_eq!(e.path, "precheck.python", "{e}");
        let e = spec("precheck: {timeout: 3}").unwrap_err();
        assert!(e.to_string().contains("timeout"), "{e}");
        let s = spec("precheck: {enabled: true, python: python3}").unwrap();
        assert_eq!(s.precheck().unwrap().python, "python3");
    }
}
