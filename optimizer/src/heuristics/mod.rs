//! Runtime heuristics: per-job corrections while a job runs, improved from DLRover's. One
//! heuristic per file behind [`Heuristic`], chosen with the serde enum [`HeuristicKind`]:
//!
//! * [`hot_ps`]: a PS whose CPU use stays near its limit gets more CPU (a migration); a job
//!   whose every PS is hot gets one more PS.
//! * [`oom_growth`]: a process killed for memory comes back with more, up to a cap.
//! * [`pending_shrink`]: processes that wait too long to be placed are given up (workers) or
//!   asked for with less CPU (PS).
//! * [`speed_up`]: the worker count follows the speed-up observed at the counts tried so far.
//!
//! Like the LP policies they are pure: the clock (`now_s`), the observations and the decisions
//! already taken (`history`, for cool-downs) are inputs, and the same input gives the same
//! proposals. Thresholds, hysteresis bands and cool-downs are fields an operator sets in TOML,
//! not constants. [`Heuristics::plan`] runs a list of them and merges their proposals into one
//! [`ScalePlan`]: the first proposal about a role's count or about a process wins.

pub mod hot_ps;
pub mod oom_growth;
pub mod pending_shrink;
pub mod speed_up;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use crate::plan::{JobConfig, Migration, ProcessResources, Role, ScalePlan};
use crate::units::{Bytes, JobId, Millicores};

pub use hot_ps::HotPs;
pub use oom_growth::OomGrowth;
pub use pending_shrink::PendingShrink;
pub use speed_up::SpeedUp;

/// One process of a running job as the brain last saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessRuntime {
    pub index: u32,
    pub resources: ProcessResources,
    /// CPU use over the recent samples, oldest first.
    pub cpu_samples: Vec<Millicores>,
    /// Highest resident memory seen.
    pub memory_peak: Bytes,
    /// Kills for exceeding memory since the process's resources last changed.
    pub oom_kills: u32,
    /// Set while the process waits to be placed: since when (seconds).
    pub pending_since_s: Option<f64>,
    /// The node it runs on, as the platform names it (empty: not known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
}

/// Samples per second the job reached with `workers` workers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpeedPoint {
    pub workers: u32,
    pub samples_per_s: f64,
}

/// What kind of change a decision made, for cool-downs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    PsCpu,
    /// The job's PS count.
    PsCount,
    Memory,
    Pending,
    Workers,
}

/// A decision already carried out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub at_s: f64,
    pub kind: ChangeKind,
    /// The process it was about, if one.
    pub process: Option<(Role, u32)>,
}

/// A running job as the heuristics see it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRuntime {
    pub job: Option<JobId>,
    pub now_s: f64,
    pub config: JobConfig,
    pub min_workers: u32,
    pub max_workers: u32,
    pub ps: Vec<ProcessRuntime>,
    pub workers: Vec<ProcessRuntime>,
    pub speed: Vec<SpeedPoint>,
    pub history: Vec<Change>,
}

impl JobRuntime {
    /// Rejects numbers no heuristic can reason about, naming the value.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |m: String| Err(PolicyError::InvalidProblem(m));
        if !self.now_s.is_finite() {
            return bad(format!("now_s is {}", self.now_s));
        }
        if self.min_workers > self.max_workers {
            return bad(format!(
                "min_workers {} is above max_workers {}",
                self.min_workers, self.max_workers
            ));
        }
        for (role, list) in [(Role::PS, &self.ps), (Role::WORKER, &self.workers)] {
            for p in list {
                if let Some(t) = p.pending_since_s
                    && !(t.is_finite() && t <= self.now_s)
                {
                    return bad(format!("{role}-{} pending since {t}", p.index));
                }
            }
        }
        if let Some(s) = self
            .speed
            .iter()
            .find(|s| !(s.samples_per_s.is_finite() && s.samples_per_s >= 0.0) || s.workers == 0)
        {
            return bad(format!(
                "speed {} samples/s at {} workers",
                s.samples_per_s, s.workers
            ));
        }
        if let Some(c) = self.history.iter().find(|c| !c.at_s.is_finite()) {
            return bad(format!("a {:?} change at {}", c.kind, c.at_s));
        }
        Ok(())
    }

    /// Whether a change of `kind` (about `process`, if given) happened less than `cooldown_s`
    /// ago.
    pub fn cooling(&self, kind: ChangeKind, process: Option<(Role, u32)>, cooldown_s: f64) -> bool {
        self.history.iter().any(|c| {
            c.kind == kind
                && (process.is_none() || c.process == process)
                && self.now_s - c.at_s < cooldown_s
        })
    }
}

/// One thing a heuristic wants done, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Action {
    SetCount { role: Role, count: u32 },
    Migrate(Migration),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub kind: ChangeKind,
    pub action: Action,
    pub reason: String,
}

/// A runtime heuristic: proposals for one job from its observations.
pub trait Heuristic {
    fn name(&self) -> &'static str;
    /// Checks the operator's settings once, when the policy is loaded.
    fn validate(&self) -> Result<(), PolicyError>;
    fn propose(&self, job: &JobRuntime) -> Result<Vec<Proposal>, PolicyError>;
}

/// A heuristic an operator names in TOML, e.g. `[[heuristics]] kind = "hot_ps"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum HeuristicKind {
    HotPs(HotPs),
    OomGrowth(OomGrowth),
    PendingShrink(PendingShrink),
    SpeedUp(SpeedUp),
}

impl HeuristicKind {
    pub fn heuristic(&self) -> &dyn Heuristic {
        match self {
            HeuristicKind::HotPs(h) => h,
            HeuristicKind::OomGrowth(h) => h,
            HeuristicKind::PendingShrink(h) => h,
            HeuristicKind::SpeedUp(h) => h,
        }
    }
}

/// The heuristics in force, in the order they are asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heuristics {
    pub heuristics: Vec<HeuristicKind>,
}

impl Default for Heuristics {
    /// All four with their defaults; OOM first, since a process that cannot run matters most.
    fn default() -> Self {
        Heuristics {
            heuristics: vec![
                HeuristicKind::OomGrowth(OomGrowth::default()),
                HeuristicKind::PendingShrink(PendingShrink::default()),
                HeuristicKind::HotPs(HotPs::default()),
                HeuristicKind::SpeedUp(SpeedUp::default()),
            ],
        }
    }
}

impl Heuristics {
    /// Each heuristic's settings, then what they say together: one table per heuristic (two
    /// would contradict each other), and a PS that `pending_shrink` may not shrink below
    /// `min_ps_cpu` must be allowed at least that much by `hot_ps.max_cpu`.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (i, h) in self.heuristics.iter().enumerate() {
            h.heuristic()
                .validate()
                .map_err(|e| PolicyError::InvalidConfig(format!("heuristics[{i}]: {e}")))?;
            let name = h.heuristic().name();
            if let Some(first) = self.heuristics[..i]
                .iter()
                .position(|o| o.heuristic().name() == name)
            {
                return Err(PolicyError::InvalidConfig(format!(
                    "heuristics[{i}]: {name} is already heuristics[{first}]; two tables of one \
                     heuristic contradict each other: keep one"
                )));
            }
        }
        let find = |f: fn(&HeuristicKind) -> bool| self.heuristics.iter().position(f);
        if let (Some(p), Some(h)) = (
            find(|h| matches!(h, HeuristicKind::PendingShrink(_))),
            find(|h| matches!(h, HeuristicKind::HotPs(_))),
        ) && let (HeuristicKind::PendingShrink(pending), HeuristicKind::HotPs(hot)) =
            (&self.heuristics[p], &self.heuristics[h])
            && pending.min_ps_cpu > hot.max_cpu
        {
            return Err(PolicyError::InvalidConfig(format!(
                "heuristics[{p}].min_ps_cpu ({}m) is above heuristics[{h}].max_cpu ({}m): \
                 pending_shrink would keep a PS above the most CPU hot_ps allows one",
                pending.min_ps_cpu.0, hot.max_cpu.0
            )));
        }
        Ok(())
    }

    /// Every heuristic's proposals in order, each with the heuristic's name; a later proposal
    /// about a count or a process already proposed is dropped (the first wins).
    pub fn proposals(
        &self,
        job: &JobRuntime,
    ) -> Result<Vec<(&'static str, Proposal)>, PolicyError> {
        job.validate()?;
        let mut out: Vec<(&'static str, Proposal)> = Vec::new();
        for h in &self.heuristics {
            for p in h.heuristic().propose(job)? {
                let taken = out.iter().any(|(_, q)| match (&q.action, &p.action) {
                    (Action::SetCount { role: a, .. }, Action::SetCount { role: b, .. }) => a == b,
                    (Action::Migrate(a), Action::Migrate(b)) => a.key == b.key,
                    _ => false,
                });
                if !taken {
                    out.push((h.heuristic().name(), p));
                }
            }
        }
        Ok(out)
    }

    /// Every heuristic's proposals merged into one plan (empty when nothing is to be done).
    pub fn plan(&self, job: &JobRuntime, version: u64) -> Result<ScalePlan, PolicyError> {
        let mut plan = ScalePlan {
            job: job.job,
            version,
            ..Default::default()
        };
        for (name, p) in self.proposals(job)? {
            match p.action {
                Action::SetCount { role, count } => plan.set_count(role, count),
                Action::Migrate(m) => plan.migrations.push(m),
            }
            let why = format!("{name}: {}", p.reason);
            // One reason for several processes changed alike (a whole role grown).
            if !plan.reasons.contains(&why) {
                plan.reasons.push(why);
            }
        }
        Ok(plan)
    }
}

/// `Err` naming `field` unless `v` is finite and within `lo..=hi`.
pub(crate) fn check_range(
    heuristic: &str,
    field: &str,
    v: f64,
    lo: f64,
    hi: f64,
) -> Result<(), PolicyError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(PolicyError::InvalidConfig(format!(
            "{heuristic}.{field} is {v}, outside [{lo}, {hi}]"
        )))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn res(cpu: u64, memory_mib: u64) -> ProcessResources {
        ProcessResources {
            cpu: Millicores(cpu),
            memory: Bytes(memory_mib << 20),
            gpus: Default::default(),
        }
    }

    pub fn process(index: u32, cpu: u64, memory_mib: u64) -> ProcessRuntime {
        ProcessRuntime {
            index,
            resources: res(cpu, memory_mib),
            ..Default::default()
        }
    }

    pub fn job(ps: u32, workers: u32) -> JobRuntime {
        JobRuntime {
            job: Some(JobId(1)),
            now_s: 10_000.0,
            config: JobConfig {
                ps,
                workers,
                ps_resources: res(1000, 1024),
                worker_resources: res(1000, 1024),
            },
            min_workers: 1,
            max_workers: 16,
            ps: (0..ps).map(|i| process(i, 1000, 1024)).collect(),
            workers: (0..workers).map(|i| process(i, 1000, 1024)).collect(),
            speed: Vec::new(),
            history: Vec::new(),
        }
    }

    #[test]
    fn the_first_proposal_about_a_process_wins_and_reasons_say_who() {
        let mut j = job(1, 2);
        j.ps[0].oom_kills = 1;
        j.ps[0].memory_peak = Bytes(1000 << 20);
        j.ps[0].cpu_samples = vec![Millicores(990); 5];
        let plan = Heuristics::default().plan(&j, 7).unwrap();
        assert_eq!(plan.version, 7);
        assert_eq!(plan.migrations.len(), 1, "{plan:?}");
        let m = &plan.migrations[0];
        assert_eq!((m.key.role, m.key.index), (Role::PS, 0));
        assert!(
            m.resources.memory.unwrap().0 > 1024 << 20,
            "OOM first: {m:?}"
        );
        assert!(plan.reasons[0].starts_with("oom_growth: "), "{plan:?}");
    }

    #[test]
    fn nothing_to_do_is_an_empty_plan_and_bad_input_a_typed_error() {
        let plan = Heuristics::default().plan(&job(2, 4), 1).unwrap();
        assert!(plan.is_empty(), "{plan:?}");
        let mut j = job(1, 1);
        j.now_s = f64::NAN;
        assert!(matches!(
            Heuristics::default().plan(&j, 1),
            Err(PolicyError::InvalidProblem(m)) if m.contains("now_s")
        ));
        let mut j = job(1, 1);
        j.workers[0].pending_since_s = Some(j.now_s + 5.0);
        assert!(Heuristics::default().plan(&j, 1).is_err());
    }

    fn arb_job() -> impl proptest::strategy::Strategy<Value = JobRuntime> {
        use proptest::prelude::*;
        (
            1u32..4,
            1u32..8,
            1u32..4,
            proptest::collection::vec((0u64..3000, 0u32..3, any::<bool>(), 0u64..4096), 12),
            proptest::collection::vec((1u32..10, 0.0f64..1000.0), 0..5),
            any::<bool>(),
        )
            .prop_map(|(ps, workers, min, procs, speed, cooled)| {
                let mut j = job(ps, workers);
                j.min_workers = min.min(workers);
                j.max_workers = 8;
                for (i, p) in j.ps.iter_mut().chain(j.workers.iter_mut()).enumerate() {
                    let (cpu, oom, pending, peak) = procs[i % procs.len()];
                    p.cpu_samples = vec![Millicores(cpu); 4];
                    p.oom_kills = oom;
                    p.memory_peak = Bytes(peak << 20);
                    p.pending_since_s = pending.then_some(0.0);
                }
                j.speed = speed
                    .into_iter()
                    .map(|(workers, samples_per_s)| SpeedPoint {
                        workers,
                        samples_per_s,
                    })
                    .collect();
                if cooled {
                    j.history.push(Change {
                        at_s: j.now_s - 1.0,
                        kind: ChangeKind::Workers,
                        process: None,
                    });
                }
                j
            })
    }

    proptest::proptest! {
        /// Whatever the observations: worker counts stay within the job's bounds, no process is
        /// migrated twice, memory and CPU stay within the caps and only grow where a heuristic
        /// grows them, a cooled-down kind is left alone, and the same input gives the same plan.
        #[test]
        fn plans_respect_bounds_caps_and_cooldowns(j in arb_job()) {
            let h = Heuristics::default();
            let plan = h.plan(&j, 3).unwrap();
            proptest::prop_assert_eq!(&h.plan(&j, 3).unwrap(), &plan);
            if let Some(&w) = plan.count_of(Role::WORKER).as_ref() {
                proptest::prop_assert!(w >= j.min_workers && w <= j.max_workers, "{plan:?}");
                proptest::prop_assert!(!j.cooling(ChangeKind::Workers, None, 300.0) || w <= j.config.workers);
            }
            if let Some(ps) = plan.count_of(Role::PS) {
                proptest::prop_assert_eq!(ps, j.config.ps + 1);
                proptest::prop_assert!(ps <= HotPs::default().max_ps);
            }
            let mut seen = std::collections::BTreeSet::new();
            for m in &plan.migrations {
                proptest::prop_assert!(seen.insert((m.key.role, m.key.index)), "{plan:?}");
                proptest::prop_assert!(m.resources.memory.unwrap() <= OomGrowth::default().max_memory);
                proptest::prop_assert!(m.resources.cpu.unwrap() <= HotPs::default().max_cpu);
            }
            // A reason per change, said once where several processes change alike.
            let changes = plan.roles.len() + plan.migrations.len();
            proptest::prop_assert!(plan.reasons.len() <= changes, "{plan:?}");
            proptest::prop_assert_eq!(plan.reasons.is_empty(), changes == 0);
            let distinct: std::collections::BTreeSet<&String> = plan.reasons.iter().collect();
            proptest::prop_assert_eq!(distinct.len(), plan.reasons.len());
        }
    }

    #[test]
    fn operators_configure_heuristics_in_toml_and_typos_name_their_path() {
        let h: Heuristics = toml::from_str(
            r#"
            [[heuristics]]
            kind = "hot_ps"
            hot_fraction = 0.8
            cooldown_s = 120.0

            [[heuristics]]
            kind = "speed_up"
            "#,
        )
        .unwrap();
        h.validate().unwrap();
        assert!(
            matches!(&h.heuristics[0], HeuristicKind::HotPs(p) if p.hot_fraction == 0.8 && p.cooldown_s == 120.0)
        );
        let e =
            toml::from_str::<Heuristics>("[[heuristics]]\nkind = \"hot_ps\"\nhot_fracton = 0.8\n")
                .unwrap_err();
        assert!(e.to_string().contains("hot_fracton"), "{e}");
        let h: Heuristics =
            toml::from_str("[[heuristics]]\nkind = \"oom_growth\"\ngrowth = 0.5\n").unwrap();
        assert!(
            h.validate()
                .unwrap_err()
                .to_string()
                .contains("oom_growth.growth")
        );
    }
}
