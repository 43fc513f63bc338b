//! Faults injected into a replay, and how the system under test handles them.
//!
//! Two kinds of fault strike nodes at random, independently, at round boundaries:
//!
//! * a **failure** ([`NodeFailures`]): the node is down for `repair_s`. The jobs on it stop
//!   making progress; their processes either exit (a crash, noticed after `crash_detect_s`) or
//!   hang in a collective (a share `hang_share` of failures, noticed after `hang_detect_s` by a
//!   step clock, or only after the collective's own `hang_timeout_s` without one). Until it is
//!   noticed, a job keeps the GPUs it holds on the other nodes and makes no progress; then it
//!   gives them back and waits for the scheduler to place it again (and pays the restart
//!   penalty).
//! * a **slowdown** ([`Slowdowns`]): the node computes at `factor` of its speed for
//!   `duration_s`. A synchronous job runs at its slowest node's speed. With detection, the node
//!   is found a straggler after `straggler_detect_s` and isolated until it is well again: the
//!   jobs on it are moved off (a restart). Without, they run slowly until it recovers.
//!
//! [`FaultHandling`] says which of the two ways a replay handles them; its defaults are the
//! figures of the live system (docs/faults.md). Faults and their effects begin and end at
//! round boundaries, but for a stall, which ends at its exact instant.

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::world::JobState;
use crate::error::PolicyError;

/// Nodes fail independently, exponentially with mean `mtbf_s` (per node, or per GPU with
/// `per_gpu`: a node of 8 GPUs then fails 8 times as often), and are back after `repair_s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFailures {
    pub mtbf_s: f64,
    pub repair_s: f64,
    /// `mtbf_s` is each GPU's: a node's failures add up over its GPUs.
    #[serde(default)]
    pub per_gpu: bool,
    /// Of the failures, the share whose jobs hang (a collective waiting on the lost node)
    /// rather than exit, in [0, 1].
    #[serde(default)]
    pub hang_share: f64,
}

/// Nodes slow down independently, exponentially with mean `mtbs_s` between slowdowns, to
/// `factor` of their speed for `duration_s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slowdowns {
    pub mtbs_s: f64,
    /// The slowed node's speed, in (0, 1).
    pub factor: f64,
    pub duration_s: f64,
}

/// A fault at a set time, as a fault trace records it (`brainctl whatif --faults FILE`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedFault {
    /// When it strikes: at the first round boundary at or after it.
    pub at_s: f64,
    /// The node, by its position in the cluster (from 0).
    pub node: usize,
    pub kind: FaultKind,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultKind {
    /// The node fails and its jobs' processes exit; it is back after `down_s`.
    Crash { down_s: f64 },
    /// The node fails and its jobs hang in a collective; it is back after `down_s`.
    Hang { down_s: f64 },
    /// The node computes at `factor` of its speed for `duration_s`.
    Slow { factor: f64, duration_s: f64 },
}

/// Whether faults are looked for, or waited out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Handling {
    /// Brain's: a hang is found by the step clock, a slow node is found a straggler and
    /// isolated.
    #[default]
    DetectAndIsolate,
    /// No detector: a hang lasts until the collective's own timeout, a slow node is kept.
    WaitForCrash,
}

impl Handling {
    /// How a row's label says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Handling::DetectAndIsolate => "detect",
            Handling::WaitForCrash => "wait",
        }
    }
}

/// How long each fault takes to notice. The defaults are the live system's: the job master's
/// heartbeat timeout (10 s) for a lost node, the stability policy's `hang_min_s` (120 s) plus
/// the stacks' capture (at most 5 s) for a hang, two one-second reports for a straggler
/// (docs/faults.md), and NCCL's default collective timeout (30 min) for a hang nobody looks
/// for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultHandling {
    #[serde(default)]
    pub handling: Handling,
    #[serde(default = "default_crash_detect")]
    pub crash_detect_s: f64,
    #[serde(default = "default_hang_detect")]
    pub hang_detect_s: f64,
    #[serde(default = "default_hang_timeout")]
    pub hang_timeout_s: f64,
    #[serde(default = "default_straggler_detect")]
    pub straggler_detect_s: f64,
}

fn default_crash_detect() -> f64 {
    10.0
}
fn default_hang_detect() -> f64 {
    125.0
}
fn default_hang_timeout() -> f64 {
    1800.0
}
fn default_straggler_detect() -> f64 {
    2.0
}

impl Default for FaultHandling {
    fn default() -> Self {
        FaultHandling {
            handling: Handling::default(),
            crash_detect_s: default_crash_detect(),
            hang_detect_s: default_hang_detect(),
            hang_timeout_s: default_hang_timeout(),
            straggler_detect_s: default_straggler_detect(),
        }
    }
}

/// Checks the fault settings; the error names the setting.
pub(super) fn validate(
    failures: Option<&NodeFailures>,
    slowdowns: Option<&Slowdowns>,
    scripted: &[ScriptedFault],
    handling: &FaultHandling,
) -> Result<(), PolicyError> {
    let bad = |m: String| Err(PolicyError::InvalidConfig(m));
    let positive = |x: f64| x.is_finite() && x > 0.0;
    let non_negative = |x: f64| x.is_finite() && x >= 0.0;
    if let Some(f) = failures {
        if !(positive(f.mtbf_s) && non_negative(f.repair_s)) {
            return bad(format!(
                "node failures: mtbf_s {}, repair_s {} (expected > 0 and >= 0)",
                f.mtbf_s, f.repair_s
            ));
        }
        if !(0.0..=1.0).contains(&f.hang_share) {
            return bad(format!(
                "node failures: hang_share {} is not in [0, 1]",
                f.hang_share
            ));
        }
    }
    if let Some(s) = slowdowns
        && !(positive(s.mtbs_s) && positive(s.duration_s) && s.factor > 0.0 && s.factor < 1.0)
    {
        return bad(format!(
            "slowdowns: mtbs_s {}, factor {}, duration_s {} (expected > 0, in (0, 1), > 0)",
            s.mtbs_s, s.factor, s.duration_s
        ));
    }
    for f in scripted {
        let fine = f.at_s.is_finite()
            && f.at_s >= 0.0
            && match f.kind {
                FaultKind::Crash { down_s } | FaultKind::Hang { down_s } => non_negative(down_s),
                FaultKind::Slow { factor, duration_s } => {
                    positive(duration_s) && factor > 0.0 && factor < 1.0
                }
            };
        if !fine {
            return bad(format!(
                "fault at {} s on node {}: {:?} (times >= 0, a slowdown's factor in (0, 1))",
                f.at_s, f.node, f.kind
            ));
        }
    }
    for (name, x) in [
        ("crash_detect_s", handling.crash_detect_s),
        ("hang_detect_s", handling.hang_detect_s),
        ("hang_timeout_s", handling.hang_timeout_s),
        ("straggler_detect_s", handling.straggler_detect_s),
    ] {
        if !non_negative(x) {
            return bad(format!("fault handling: {name} is {x}, expected >= 0"));
        }
    }
    Ok(())
}

/// A node's slowdown under way.
#[derive(Clone, Copy, Debug)]
struct Slow {
    since: f64,
    until: f64,
    factor: f64,
    /// Found a straggler and isolated until `until`.
    isolated: bool,
}

/// What struck a node at a round boundary.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Hit {
    /// It failed; its jobs notice after `detect_s`.
    Failed { node: usize, detect_s: f64 },
    /// It was found slow and isolated: its jobs move off now.
    Isolated { node: usize },
}

/// The nodes' faults as a replay goes.
pub(super) struct NodeFaults {
    down_until: Vec<f64>,
    slow: Vec<Option<Slow>>,
    /// Scripted faults yet to strike, soonest last.
    script: Vec<ScriptedFault>,
}

impl NodeFaults {
    /// The faults of `nodes` nodes, with `script` to strike as its times come; a scripted
    /// fault on a node that does not exist is an error.
    pub(super) fn new(nodes: usize, script: &[ScriptedFault]) -> Result<Self, PolicyError> {
        if let Some(f) = script.iter().find(|f| f.node >= nodes) {
            return Err(PolicyError::InvalidConfig(format!(
                "the fault at {} s is on node {}, but the cluster has nodes 0 to {}",
                f.at_s,
                f.node,
                nodes.saturating_sub(1)
            )));
        }
        let mut script = script.to_vec();
        script.sort_by(|a, b| b.at_s.total_cmp(&a.at_s));
        Ok(NodeFaults {
            down_until: vec![f64::NEG_INFINITY; nodes],
            slow: vec![None; nodes],
            script,
        })
    }

    /// How long a failure's jobs take to notice it.
    fn detect_s(hangs: bool, handling: &FaultHandling) -> f64 {
        match (hangs, handling.handling) {
            (false, _) => handling.crash_detect_s,
            (true, Handling::DetectAndIsolate) => handling.hang_detect_s,
            (true, Handling::WaitForCrash) => handling.hang_timeout_s,
        }
    }

    /// Node `n` fails at `t` for `down_s`.
    fn fail(&mut self, n: usize, t: f64, down_s: f64, hangs: bool, h: &FaultHandling) -> Hit {
        self.down_until[n] = t + down_s;
        self.slow[n] = None;
        Hit::Failed {
            node: n,
            detect_s: Self::detect_s(hangs, h),
        }
    }

    /// The scripted faults due by `t`; those on a node down meanwhile do nothing.
    fn scripted(&mut self, t: f64, handling: &FaultHandling) -> Vec<Hit> {
        let mut hits = Vec::new();
        while let Some(f) = self.script.pop_if(|f| f.at_s <= t) {
            let n = f.node;
            if self.down_until[n] > t {
                continue;
            }
            match f.kind {
                FaultKind::Crash { down_s } => hits.push(self.fail(n, t, down_s, false, handling)),
                FaultKind::Hang { down_s } => hits.push(self.fail(n, t, down_s, true, handling)),
                FaultKind::Slow { factor, duration_s } => {
                    self.slow[n] = Some(Slow {
                        since: t,
                        until: t + duration_s,
                        factor,
                        isolated: false,
                    })
                }
            }
        }
        hits
    }

    /// At the round boundary `t`: slowdowns that are over end, new failures and slowdowns are
    /// drawn (each node's failure first, in node order; a node down neither fails nor slows),
    /// and slow nodes found by now are isolated. `gpus[n]` is node `n`'s GPUs.
    pub(super) fn round(
        &mut self,
        t: f64,
        round_s: f64,
        gpus: &[u32],
        config: &super::SimConfig,
        rng: &mut impl Rng,
    ) -> Vec<Hit> {
        let handling = &config.fault_handling;
        for slow in &mut self.slow {
            if slow.is_some_and(|s| s.until <= t) {
                *slow = None;
            }
        }
        let mut hits = self.scripted(t, handling);
        for (n, &node_gpus) in gpus.iter().enumerate() {
            if self.down_until[n] > t {
                continue;
            }
            if let Some(f) = &config.node_failures {
                let mtbf = if f.per_gpu {
                    f.mtbf_s / f64::from(node_gpus.max(1))
                } else {
                    f.mtbf_s
                };
                if rng.random::<f64>() < 1.0 - (-round_s / mtbf).exp() {
                    let hangs = f.hang_share > 0.0 && rng.random::<f64>() < f.hang_share;
                    hits.push(self.fail(n, t, f.repair_s, hangs, handling));
                    continue;
                }
            }
            if let Some(s) = &config.slowdowns
                && self.slow[n].is_none()
                && rng.random::<f64>() < 1.0 - (-round_s / s.mtbs_s).exp()
            {
                self.slow[n] = Some(Slow {
                    since: t,
                    until: t + s.duration_s,
                    factor: s.factor,
                    isolated: false,
                });
            }
            if handling.handling == Handling::DetectAndIsolate
                && let Some(s) = &mut self.slow[n]
                && !s.isolated
                && t >= s.since + handling.straggler_detect_s
            {
                s.isolated = true;
                hits.push(Hit::Isolated { node: n });
            }
        }
        hits
    }

    /// The GPUs node `n` (of `gpus`) offers at `t`: none while down or isolated.
    pub(super) fn gpus_up(&self, n: usize, t: f64, gpus: u32) -> u32 {
        if self.down_until[n] > t || self.slow[n].is_some_and(|s| s.isolated) {
            0
        } else {
            gpus
        }
    }

    /// Node `n`'s speed now: its slowdown's factor, or 1.
    pub(super) fn speed(&self, n: usize) -> f64 {
        self.slow[n].map_or(1.0, |s| s.factor)
    }

    /// Whether some node is down or isolated at `t` (capacity may yet come back).
    pub(super) fn any_out(&self, t: f64) -> bool {
        self.down_until.iter().any(|u| *u > t) || self.slow.iter().flatten().any(|s| s.isolated)
    }
}

/// Applies a fault to the jobs it strikes. A failed node's GPUs are gone at once; a job on it
/// keeps its others and makes no progress until the failure is noticed (at once if it is
/// noticed in no time). A job on a node found slow is moved off now. A job already stalled only
/// loses the node's GPUs. With checkpoints (`saves`), a failure takes a training job back to
/// its last save; a move off a slow node loses nothing (a consistent cut comes first).
pub(super) fn strike(active: &mut [JobState], hit: Hit, saves: bool) {
    let (node, detect_s, failed) = match hit {
        Hit::Failed { node, detect_s } => (node, detect_s, true),
        Hit::Isolated { node } => (node, 0.0, false),
    };
    for job in active.iter_mut() {
        if !job.slots.iter().any(|s| s.0 == node) {
            continue;
        }
        if job.stall_left > 0.0 {
            job.slots.retain(|s| s.0 != node);
            continue;
        }
        job.faults += 1;
        job.rescale_left = 0.0;
        if failed && saves && job.app.is_some() {
            job.roll_back();
        }
        if detect_s > 0.0 {
            job.slots.retain(|s| s.0 != node);
            job.stall_left = detect_s;
        } else {
            job.slots.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_pcg::Pcg64;

    use super::*;
    use crate::sim::SimConfig;

    fn config(handling: Handling) -> SimConfig {
        SimConfig {
            slowdowns: Some(Slowdowns {
                mtbs_s: 1.0,
                factor: 0.5,
                duration_s: 300.0,
            }),
            fault_handling: FaultHandling {
                handling,
                straggler_detect_s: 90.0,
                ..FaultHandling::default()
            },
            ..SimConfig::default()
        }
    }

    #[test]
    fn a_slow_node_is_isolated_once_found_and_back_when_well() {
        let c = config(Handling::DetectAndIsolate);
        let mut f = NodeFaults::new(1, &[]).unwrap();
        let mut rng = Pcg64::seed_from_u64(1);
        // Slowed at 0 (a slowdown a second on average), found at the first boundary 90 s on.
        assert!(f.round(0.0, 60.0, &[4], &c, &mut rng).is_empty());
        assert_eq!((f.speed(0), f.gpus_up(0, 0.0, 4)), (0.5, 4));
        assert!(f.round(60.0, 60.0, &[4], &c, &mut rng).is_empty());
        assert_eq!(
            f.round(120.0, 60.0, &[4], &c, &mut rng),
            vec![Hit::Isolated { node: 0 }]
        );
        assert_eq!(f.gpus_up(0, 120.0, 4), 0);
        assert!(f.any_out(120.0));
        // Well again at 300, and at once slowed again (not isolated yet).
        assert!(f.round(300.0, 60.0, &[4], &c, &mut rng).is_empty());
        assert_eq!(f.gpus_up(0, 300.0, 4), 4);
    }

    #[test]
    fn without_detection_a_slow_node_is_kept() {
        let c = config(Handling::WaitForCrash);
        let mut f = NodeFaults::new(2, &[]).unwrap();
        let mut rng = Pcg64::seed_from_u64(1);
        for k in 0..10 {
            assert!(
                f.round(60.0 * k as f64, 60.0, &[4, 4], &c, &mut rng)
                    .is_empty()
            );
        }
        assert_eq!(f.gpus_up(1, 600.0, 4), 4);
        assert_eq!(f.speed(1), 0.5);
        assert!(!f.any_out(600.0));
    }

    #[test]
    fn a_hang_is_noticed_at_the_step_clock_or_the_collective_timeout() {
        for (handling, want) in [
            (Handling::DetectAndIsolate, 125.0),
            (Handling::WaitForCrash, 1800.0),
        ] {
            let c = SimConfig {
                node_failures: Some(NodeFailures {
                    mtbf_s: 1e-9,
                    repair_s: 600.0,
                    per_gpu: false,
                    hang_share: 1.0,
                }),
                fault_handling: FaultHandling {
                    handling,
                    ..FaultHandling::default()
                },
                ..SimConfig::default()
            };
            let mut f = NodeFaults::new(1, &[]).unwrap();
            let mut rng = Pcg64::seed_from_u64(3);
            assert_eq!(
                f.round(0.0, 60.0, &[8], &c, &mut rng),
                vec![Hit::Failed {
                    node: 0,
                    detect_s: want
                }]
            );
            // Down until repaired: no second failure meanwhile.
            assert!(f.round(540.0, 60.0, &[8], &c, &mut rng).is_empty());
            assert_eq!(f.gpus_up(0, 540.0, 8), 0);
            assert_eq!(f.gpus_up(0, 600.0, 8), 8);
        }
    }

    #[test]
    fn per_gpu_failures_strike_a_larger_node_more_often() {
        let c = SimConfig {
            node_failures: Some(NodeFailures {
                mtbf_s: 60.0 * 200.0,
                repair_s: 0.0,
                per_gpu: true,
                hang_share: 0.0,
            }),
            ..SimConfig::default()
        };
        let mut f = NodeFaults::new(2, &[]).unwrap();
        let mut rng = Pcg64::seed_from_u64(7);
        let mut hits = [0u32; 2];
        for k in 0..20_000 {
            for h in f.round(60.0 * k as f64, 60.0, &[1, 8], &c, &mut rng) {
                if let Hit::Failed { node, .. } = h {
                    hits[node] += 1;
                }
            }
        }
        // About 100 and 800 expected.
        assert!((70..130).contains(&hits[0]), "{hits:?}");
        assert!((700..900).contains(&hits[1]), "{hits:?}");
    }

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let h = FaultHandling::default();
        let f = |hang_share| NodeFailures {
            mtbf_s: 1.0,
            repair_s: 1.0,
            per_gpu: false,
            hang_share,
        };
        assert!(validate(Some(&f(0.5)), None, &[], &h).is_ok());
        let e = validate(Some(&f(1.5)), None, &[], &h)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hang_share 1.5"), "{e}");
        let s = Slowdowns {
            mtbs_s: 1.0,
            factor: 1.0,
            duration_s: 1.0,
        };
        let e = validate(None, Some(&s), &[], &h).unwrap_err().to_string();
        assert!(e.contains("factor 1"), "{e}");
        let h = FaultHandling {
            hang_timeout_s: -1.0,
            ..FaultHandling::default()
        };
        let e = validate(None, None, &[], &h).unwrap_err().to_string();
        assert!(e.contains("hang_timeout_s is -1"), "{e}");
        let slow = ScriptedFault {
            at_s: 5.0,
            node: 3,
            kind: FaultKind::Slow {
                factor: 2.0,
                duration_s: 60.0,
            },
        };
        let e = validate(
            None,
            None,
            std::slice::from_ref(&slow),
            &FaultHandling::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("fault at 5 s on node 3"), "{e}");
        let e = NodeFaults::new(2, &[slow]).err().unwrap().to_string();
        assert!(
            e.contains("on node 3, but the cluster has nodes 0 to 1"),
            "{e}"
        );
    }
}
