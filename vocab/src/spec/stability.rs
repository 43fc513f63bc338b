//! The job's `stability:` settings: when a training process counts as a straggler or as hung,
//! and what the job master does about a straggler.
//!
//! A **straggler** is a training process whose compute time per step (the time it spends on
//! its own work, outside collectives and waits) stays at least `straggler_ratio` times the
//! median of the rest of its role group, over two reports in a row (each report covers about
//! a second of steps). A **hang** is a training group (or a ps worker) with no step for
//! `hang_after_steps` of the job's typical steps, and never sooner than `hang_min_s`: the
//! job master captures the stuck processes' stacks, then restarts them from the latest cut.

use serde::{Deserialize, Serialize};

use super::JobSpec;
use crate::error::SpecError;

/// What the job master does with a straggler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StragglerAction {
    /// Say so in the job's events and status, and change nothing.
    #[default]
    Report,
    /// Replace the process on another node: the node is avoided by this job from then on; an
    /// all-reduce group first takes a checkpoint at a consistent cut and restarts from it (no
    /// step lost), a ps worker is relaunched alone.
    Replace,
    /// Take it out of the group: the group goes on one process smaller at once, without
    /// waiting for room elsewhere, and the job avoids the node from then on. The group keeps
    /// its indices: a straggler that is not the last gets a new process (placed off the node)
    /// and the last process leaves. An all-reduce group does it at a consistent cut, as
    /// `replace` does. At the role's `min`, the straggler is replaced instead. The brain may
    /// grow the group again later, on other nodes.
    Shrink,
}

impl StragglerAction {
    pub fn as_str(self) -> &'static str {
        match self {
            StragglerAction::Report => "report",
            StragglerAction::Replace => "replace",
            StragglerAction::Shrink => "shrink",
        }
    }
}

impl std::fmt::Display for StragglerAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StabilitySpec {
    /// A process computing a step this many times slower than its group's median is a
    /// straggler [default: 1.3; from 1.1 to 10].
    #[serde(default = "default_ratio")]
    pub straggler_ratio: f64,
    /// What is done with a straggler [default: `report`].
    #[serde(default)]
    pub straggler_action: StragglerAction,
    /// No step for this many of the job's typical steps is a hang [default: 50; from 3 to
    /// 100000].
    #[serde(default = "default_hang_steps")]
    pub hang_after_steps: f64,
    /// ... and never sooner than this many seconds [default: 120; from 1 to 86400].
    #[serde(default = "default_hang_min_s")]
    pub hang_min_s: f64,
}

fn default_ratio() -> f64 {
    1.3
}
fn default_hang_steps() -> f64 {
    50.0
}
fn default_hang_min_s() -> f64 {
    120.0
}

impl Default for StabilitySpec {
    fn default() -> Self {
        Self {
            straggler_ratio: default_ratio(),
            straggler_action: StragglerAction::default(),
            hang_after_steps: default_hang_steps(),
            hang_min_s: default_hang_min_s(),
        }
    }
}

impl StabilitySpec {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// How long without a step is a hang, given the job's typical step.
    pub fn hang_after_ms(&self, typical_step_ms: f64) -> u64 {
        let floor = self.hang_min_s * 1000.0;
        (self.hang_after_steps * typical_step_ms).max(floor) as u64
    }
}

impl JobSpec {
    /// Checks `stability:`: each number in its range, and an action on stragglers only where
    /// the training group can have one (a straggler is found against its peers).
    pub(super) fn validate_stability(&self) -> Result<(), SpecError> {
        let s = &self.stability;
        if s.straggler_action != StragglerAction::Report
            && let Ok(workers) = self.role_plan(self.training_role())
            && workers.max < 2
        {
            return Err(SpecError::new(
                "stability.straggler_action",
                format!(
                    "{} cannot apply: the worker group has at most {} process, and a straggler \
                     is found against its peers (use `report`, or allow 2 workers or more)",
                    s.straggler_action, workers.max
                ),
            ));
        }
        if s.straggler_action == StragglerAction::Shrink
            && let Ok(workers) = self.role_plan(self.training_role())
            && workers.min >= workers.max
        {
            return Err(SpecError::new(
                "stability.straggler_action",
                format!(
                    "shrink cannot apply: the worker group's min is {}, its max {}, so it can \
                     never lose a process (set `roles.{}.min` below `max`, or use `replace`)",
                    workers.min,
                    workers.max,
                    self.training_role()
                ),
            ));
        }
        for (field, v, lo, hi) in [
            ("straggler_ratio", s.straggler_ratio, 1.1, 10.0),
            ("hang_after_steps", s.hang_after_steps, 3.0, 100_000.0),
            ("hang_min_s", s.hang_min_s, 1.0, 86_400.0),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(SpecError::new(
                    format!("stability.{field}"),
                    format!("{v} is out of range: from {lo} to {hi}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(stability: &str) -> Result<JobSpec, SpecError> {
        let text = format!(
            "name: j\nkind: allreduce\nroles: {{worker: {{replicas: 2}}}}\nworkload: {{builtin: {{}}}}\n\
             data: {{num_samples: 100, shard_size: 10}}\ncheckpoint: {{dir: /tmp/c}}\n{stability}"
        );
        let s = JobSpec::from_yaml(&text)?;
        s.validate()?;
        Ok(s)
    }

    #[test]
    fn stability_defaults_and_its_ranges_are_checked_with_the_field() {
        let s = spec("").unwrap();
        assert!(s.stability.is_default());
        let s = spec("stability: {straggler_ratio: 1.5, straggler_action: replace}").unwrap();
        assert_eq!(s.stability.straggler_action, StragglerAction::Replace);
        assert_eq!(s.stability.straggler_ratio, 1.5);
        let e = spec("stability: {straggler_ratio: 1.0}").unwrap_err();
        assert_eq!(e.path, "stability.straggler_ratio", "{e}");
        assert!(e.to_string().contains("from 1.1 to 10"), "{e}");
        let e = spec("stability: {hang_min_s: 0}").unwrap_err();
        assert_eq!(e.path, "stability.hang_min_s", "{e}");
        let e = spec("stability: {straggler_action: sideways}").unwrap_err();
        assert!(e.to_string().contains("report"), "{e}");
        let e = spec("stability: {hang_after: 3}").unwrap_err();
        assert!(e.to_string().contains("hang_after"), "{e}");
    }

    #[test]
    fn an_action_on_stragglers_needs_a_group_that_can_have_one() {
        let one = |stability: &str| {
            let text = format!(
                "name: j\nkind: allreduce\nroles: {{worker: {{replicas: 1, max: 1}}}}\n\
                 workload: {{builtin: {{}}}}\ndata: {{num_samples: 100, shard_size: 10}}\n\
                 checkpoint: {{dir: /tmp/c}}\n{stability}"
            );
            JobSpec::from_yaml(&text).and_then(|s| s.validate().map(|()| s))
        };
        let e = one("stability: {straggler_action: replace}").unwrap_err();
        assert_eq!(e.path, "stability.straggler_action", "{e}");
        assert!(
            e.to_string()
                .contains("replace cannot apply: the worker group has at most 1 process"),
            "{e}"
        );
        assert!(one("stability: {straggler_action: report}").is_ok());
        assert!(one("").is_ok());
    }

    #[test]
    fn shrink_needs_a_worker_group_that_may_lose_a_process() {
        let with = |roles: &str| {
            let text = format!(
                "name: j\nkind: allreduce\nroles: {{worker: {roles}}}\n\
                 workload: {{builtin: {{}}}}\ndata: {{num_samples: 100, shard_size: 10}}\n\
                 checkpoint: {{dir: /tmp/c}}\nstability: {{straggler_action: shrink}}"
            );
            JobSpec::from_yaml(&text).and_then(|s| s.validate().map(|()| s))
        };
        let e = with("{replicas: 3}").unwrap_err();
        assert_eq!(e.path, "stability.straggler_action", "{e}");
        assert!(
            e.to_string()
                .contains("its max 3, so it can never lose a process (set `roles.worker.min`"),
            "{e}"
        );
        let s = with("{replicas: 3, min: 2}").unwrap();
        assert_eq!(s.stability.straggler_action, StragglerAction::Shrink);
        assert_eq!(s.stability.straggler_action.to_string(), "shrink");
    }

    #[test]
    fn a_hang_waits_the_longer_of_its_steps_and_its_floor() {
        let s = StabilitySpec::default();
        assert_eq!(s.hang_after_ms(10.0), 120_000);
        assert_eq!(s.hang_after_ms(10_000.0), 500_000);
    }
}
