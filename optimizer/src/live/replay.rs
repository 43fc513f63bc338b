//! The live round as a [`Scheduler`], so `brainctl whatif --live-round` replays a trace through
//! [`plan_round`] itself, the cool-downs, the minimum sizes and the capacity repair included,
//! around the operator's scheduler: an operator tunes the live policy offline.
//!
//! Each simulated round becomes what the live brain would see: a GPU is a slot, the cluster
//! one pool of slots (the live round plans one kind of slot, so the cluster must have one GPU
//! type), and each job reports its speed at every size it can run on (the simulator knows
//! them), from which the round fits its Amdahl model as the brain does from reports. A job
//! that holds GPUs is running, one that waits is queued. The sizes decided are placed on the
//! nodes as the schedulers place theirs (a job kept at its size keeps its GPUs). The
//! heuristics are not replayed: the simulator has no processes to observe.

use std::sync::Mutex;

use super::*;
use crate::schedule::{Assignment, BatchSizing, Packing, carry_out};

/// The live round around `inner`, with the operator's `[live]` pacing.
pub struct LiveRound<'a> {
    pub inner: &'a dyn Scheduler,
    pub config: LiveConfig,
    /// Every round's snapshot and plan, when asked for (tests compare them with a direct call).
    pub record: Option<Mutex<Vec<(LiveSnapshot, RoundPlan)>>>,
}

impl<'a> LiveRound<'a> {
    pub fn new(inner: &'a dyn Scheduler, config: LiveConfig) -> Self {
        LiveRound {
            inner,
            config,
            record: None,
        }
    }

    /// What the live brain would see of a simulated round.
    pub fn snapshot(&self, s: &Snapshot) -> Result<LiveSnapshot, PolicyError> {
        if s.worker_types.len() != 1 {
            return Err(PolicyError::InvalidConfig(format!(
                "the live round plans one kind of slot; the cluster has {} GPU types",
                s.worker_types.len()
            )));
        }
        let slots: u64 = s.nodes.iter().map(|n| n.gpus as u64).sum();
        let jobs = s
            .jobs
            .iter()
            .map(|j| {
                let now = j.current_replicas();
                let min = j.min_replicas().unwrap_or(j.max_replicas.max(1));
                LiveJob {
                    id: j.id,
                    name: j.id.to_string(),
                    state: if now > 0 {
                        LiveState::Running
                    } else {
                        LiveState::Queued
                    },
                    submitted_s: j.submitted_s,
                    workers: LiveWorkers {
                        count: if now > 0 {
                            now
                        } else {
                            j.requested_replicas.clamp(min, j.max_replicas.max(min))
                        },
                        held: now,
                        min,
                        max: j.max_replicas.max(min),
                        node_unit: 1,
                        peak: j.peak_replicas,
                        millicores: 1000,
                        ..LiveWorkers::default()
                    },
                    speed: (1..=j.max_replicas)
                        .map(|r| SpeedPoint {
                            workers: r,
                            samples_per_s: j.goodput_at(0, r),
                        })
                        .filter(|p| p.samples_per_s > 0.0)
                        .collect(),
                    samples_left: j.remaining,
                    last_change_s: j.last_change_s,
                    running_s: j.running_s,
                    restarts: j.restarts,
                    // Nothing to observe in a simulation: no processes, no PS.
                    ..LiveJob::default()
                }
            })
            .collect();
        Ok(LiveSnapshot {
            now_s: s.now_s,
            cluster: LiveCluster {
                free: Vec::new(),
                cpu_millicores: slots * 1000,
                slot_millicores: 1000,
                max_processes: u32::MAX,
                memory_bytes: 0,
                nodes: Vec::new(),
            },
            jobs,
        })
    }
}

impl Scheduler for LiveRound<'_> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn batch_sizing(&self) -> BatchSizing {
        self.inner.batch_sizing()
    }

    fn elastic(&self) -> bool {
        self.inner.elastic()
    }

    fn schedule(&self, s: &Snapshot) -> Result<Assignment, PolicyError> {
        let live = self.snapshot(s)?;
        let plan = plan_round(
            &live,
            self.inner,
            &self.config,
            &Heuristics { heuristics: vec![] },
        )?;
        let sizes = plan
            .decisions
            .iter()
            .filter(|d| d.to_workers() > 0)
            .map(|d| (d.job, 0, d.to_workers()))
            .collect();
        if let Some(r) = &self.record {
            r.lock()
                .expect("no panic under the lock")
                .push((live, plan));
        }
        carry_out(s, sizes, Packing::Tight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Pollux, SchedulerKind};
    use crate::sim::{AppProfile, ClusterSpec, SimConfig, TraceJob, Work, simulate};

    /// Six jobs of the simulator's toy application on 2 nodes of 4 GPUs, through the live
    /// round around Pollux; every round's snapshot and plan.
    fn replay(config: LiveConfig) -> (Vec<(LiveSnapshot, RoundPlan)>, crate::sim::Report) {
        let profiles: Vec<AppProfile> = vec![crate::sim::app::tests::toy_profile()];
        let trace: Vec<TraceJob> = (0..6)
            .map(|i| TraceJob {
                name: format!("j{i}"),
                submit_s: 100.0 * i as f64,
                requested_replicas: 1 + i % 3,
                work: Work::Train {
                    application: "toy".into(),
                    batch_size: 64,
                },
            })
            .collect();
        let cluster = ClusterSpec::parse("2x4:t4").unwrap();
        let inner = SchedulerKind::Pollux(Pollux::default());
        let mut round = LiveRound::new(inner.scheduler(), config);
        round.record = Some(Mutex::default());
        let sim = SimConfig {
            round_s: 30.0,
            restart_penalty_s: 10.0,
            ..SimConfig::default()
        };
        let report = simulate(&trace, &profiles, &cluster, &round, &sim, &mut ()).unwrap();
        (round.record.unwrap().into_inner().unwrap(), report)
    }

    #[test]
    fn a_replay_through_the_live_round_decides_what_the_live_brain_decides() {
        let config = LiveConfig {
            cooldown_s: 120.0,
            ..LiveConfig::default()
        };
        let (rounds, report) = replay(config.clone());
        assert!(rounds.len() > 3, "{}", rounds.len());
        assert_eq!(report.summary.finished, 6, "{:?}", report.summary);
        let inner = SchedulerKind::Pollux(Pollux::default());
        let none = Heuristics { heuristics: vec![] };
        let mut resized = std::collections::BTreeMap::<JobId, f64>::new();
        for (snap, plan) in &rounds {
            // What the brain's Control calls on the same snapshot.
            let direct = plan_round(snap, inner.scheduler(), &config, &none).unwrap();
            assert_eq!(&direct, plan);
            // The cool-down holds: a running job is resized at most once per 120 s.
            for d in plan
                .decisions
                .iter()
                .filter(|d| d.state == LiveState::Running && d.from_workers() != d.to_workers())
            {
                if let Some(t) = resized.insert(d.job, snap.now_s) {
                    assert!(snap.now_s - t >= 120.0, "{d:?} at {} after {t}", snap.now_s);
                }
            }
        }
    }

    #[test]
    fn a_cluster_of_several_gpu_types_is_refused_with_the_reason() {
        let inner = SchedulerKind::Pollux(Pollux::default());
        let round = LiveRound::new(inner.scheduler(), LiveConfig::default());
        let s = Snapshot {
            now_s: 0.0,
            worker_types: vec![WorkerType("a".into()), WorkerType("b".into())],
            nodes: vec![],
            jobs: vec![],
        };
        let e = round.schedule(&s).unwrap_err().to_string();
        assert!(e.contains("the cluster has 2 GPU types"), "{e}");
    }
}
