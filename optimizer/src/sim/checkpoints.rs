//! Checkpoints in a replay: what a fault costs in work.
//!
//! A training job saves a checkpoint every `every_s` seconds of training, each save stopping it
//! for `save_s` (what training waits for: the whole write for a synchronous save, the memory
//! copy for a flash checkpoint; docs/checkpoints.md has the live system's figures). A failure
//! of one of its nodes throws away the training since its last save: the job resumes from that
//! save, and the seconds of training lost are counted per job (`lost_training_s`). A move off a
//! slow node, a rescale or a preemption loses nothing: the live system takes a consistent cut
//! first. Without a model, a replay keeps every job's progress through a fault (as if it saved
//! at every instant, for free).
//!
//! The interval that loses least to saving and to faults together, for a job whose faults come
//! every `mtbf_s` on average, is about `sqrt(2 × save_s × mtbf_s)` (Young, 1974):
//! [`young_interval_s`].

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;

/// How often jobs save, and what a save costs them.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointModel {
    /// Seconds of training between two saves.
    pub every_s: f64,
    /// Seconds each save stops training.
    #[serde(default)]
    pub save_s: f64,
}

impl CheckpointModel {
    pub fn validate(&self) -> Result<(), PolicyError> {
        if !(self.every_s.is_finite() && self.every_s > 0.0) {
            return Err(PolicyError::InvalidConfig(format!(
                "checkpoint every_s is {}, expected > 0",
                self.every_s
            )));
        }
        if !(self.save_s.is_finite() && self.save_s >= 0.0) {
            return Err(PolicyError::InvalidConfig(format!(
                "checkpoint save_s is {}, expected >= 0",
                self.save_s
            )));
        }
        Ok(())
    }
}

/// Young's approximation of the checkpoint interval that wastes least, saving plus work lost,
/// for saves that stop training for `save_s` and faults every `mtbf_s` on average.
pub fn young_interval_s(save_s: f64, mtbf_s: f64) -> f64 {
    (2.0 * save_s * mtbf_s).sqrt()
}

/// A job's last save: what a fault takes it back to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Saved {
    pub(super) progress: f64,
    pub(super) epoch: u32,
    pub(super) training_s: f64,
    pub(super) least_work_s: f64,
    pub(super) epoch_best: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Fifo;
    use crate::sim::app::tests::toy_profile;
    use crate::sim::engine::{FaultKind, ScriptedFault};
    use crate::sim::{ClusterSpec, JobRecord, SimConfig, TraceJob, Work, simulate};

    /// The toy job (72 s of training on one GPU at batch 8) submitted at 0 on the first of
    /// two one-GPU nodes, training from 30 s (its start-up), and `kind` striking node 0 at 60.
    fn struck(kind: FaultKind, saves: Option<CheckpointModel>) -> JobRecord {
        let trace = [TraceJob {
            name: "a".into(),
            submit_s: 0.0,
            requested_replicas: 1,
            work: Work::Train {
                application: "toy".into(),
                batch_size: 8,
            },
        }];
        let config = SimConfig {
            faults: vec![ScriptedFault {
                at_s: 60.0,
                node: 0,
                kind,
            }],
            checkpoint: saves,
            ..SimConfig::default()
        };
        let cluster = ClusterSpec::uniform(2, 1, "t4");
        let r = simulate(
            &trace,
            &[toy_profile()],
            &cluster,
            &Fifo::default(),
            &config,
            &mut (),
        )
        .unwrap();
        assert_eq!(r.summary.lost_training_s, r.jobs[0].lost_training_s);
        r.jobs[0].clone()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    const EVERY_20: Option<CheckpointModel> = Some(CheckpointModel {
        every_s: 20.0,
        save_s: 1.0,
    });

    #[test]
    fn a_failure_throws_away_the_training_since_the_last_save() {
        let crash = FaultKind::Crash { down_s: 600.0 };
        // Saved at 50 (20 s trained), 1 s to save, 9 s more by 60: those 9 s are lost. Noticed
        // at 70, placed on node 1 at the round of 120, started by 150; the 52 s left with two
        // saves on the way: done at 204.
        let j = struck(crash.clone(), EVERY_20);
        assert!(close(j.lost_training_s, 9.0), "{j:?}");
        assert!(close(j.finish_s.unwrap(), 204.0), "{j:?}");
        assert!(close(j.training_s, 72.0), "{j:?}");
        assert!(close(j.saving_gpu_seconds, 3.0), "{j:?}");
        assert_eq!(j.faults, 1);
        // Without a model (and no save to pause for) the 30 s trained by 60 are kept: the 42 s
        // left, done at 192.
        let kept = struck(crash, None);
        assert_eq!(kept.lost_training_s, 0.0);
        assert!(close(kept.finish_s.unwrap(), 192.0), "{kept:?}");
        // Saving every second loses less than one; every 100 s, all 30 s.
        let often = struck(
            FaultKind::Crash { down_s: 600.0 },
            Some(CheckpointModel {
                every_s: 1.0,
                save_s: 0.0,
            }),
        );
        assert!(often.lost_training_s < 1.0, "{often:?}");
        let rarely = struck(
            FaultKind::Crash { down_s: 600.0 },
            Some(CheckpointModel {
                every_s: 100.0,
                save_s: 0.0,
            }),
        );
        assert!(close(rarely.lost_training_s, 30.0), "{rarely:?}");
        assert!(close(rarely.finish_s.unwrap(), 222.0), "{rarely:?}");
    }

    #[test]
    fn a_move_off_a_slow_node_loses_nothing() {
        let j = struck(
            FaultKind::Slow {
                factor: 0.5,
                duration_s: 600.0,
            },
            EVERY_20,
        );
        assert_eq!(j.faults, 1, "{j:?}");
        assert_eq!(j.lost_training_s, 0.0, "{j:?}");
        assert!(close(j.training_s, 72.0), "{j:?}");
    }

    #[test]
    fn bad_settings_are_refused_with_the_field() {
        let bad = |every_s, save_s| {
            CheckpointModel { every_s, save_s }
                .validate()
                .unwrap_err()
                .to_string()
        };
        assert!(bad(0.0, 1.0).contains("every_s is 0"));
        assert!(bad(f64::NAN, 1.0).contains("every_s"));
        assert!(bad(60.0, -1.0).contains("save_s is -1"));
        CheckpointModel {
            every_s: 60.0,
            save_s: 0.0,
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn young_s_interval_grows_with_the_root_of_the_save_and_of_the_mtbf() {
        // A 30 s synchronous save, a fault every 3 hours: about 13 minutes.
        assert!((young_interval_s(30.0, 10_800.0) - 804.98).abs() < 0.01);
        // A save 50 times cheaper: an interval about 7 times shorter.
        let r = young_interval_s(30.0, 10_800.0) / young_interval_s(0.6, 10_800.0);
        assert!((r - 50f64.sqrt()).abs() < 1e-9);
    }
}
