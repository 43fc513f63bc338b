//! The event loop of a simulation.
//!
//! Time advances in scheduling rounds of `round_s`. At each round boundary: faults strike and
//! nodes come back ([`super::faults`]: a job stalled by a fault not yet noticed holds its GPUs
//! out of the scheduler's sight), the scheduler sees a [`Snapshot`] of the other jobs submitted
//! and not finished, and its [`Assignment`] is applied: a job whose GPUs change restarts and
//! makes no progress for `restart_penalty_s`. Between boundaries every running job progresses
//! at its true goodput on its placement (times its slowest node's speed), epoch by epoch (a
//! rigid job: one second of its duration per second); a job that finishes mid-round finishes
//! at that instant and its GPUs wait for the next round. Idle stretches (nothing submitted
//! yet) are skipped.

use rand::SeedableRng;
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};

use super::app::AppProfile;
use super::checkpoints::CheckpointModel;
pub use super::faults::{
    FaultHandling, FaultKind, Handling, NodeFailures, ScriptedFault, Slowdowns,
};
use super::faults::{NodeFaults, strike};
use super::report::{JobRecord, Report, RoundRecord, Summary, Unfinished};
use super::setup::{Arrivals, Setup};
use super::world::{JobState, check_job};
use super::{ClusterSpec, TraceJob};
use crate::error::PolicyError;
use crate::schedule::{Assignment, NodeView, Scheduler, Snapshot, check};
use crate::units::{JobId, WorkerType};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    /// Seconds between scheduling rounds.
    #[serde(default = "default_round")]
    pub round_s: f64,
    /// Seconds a job makes no progress after its allocation changes.
    #[serde(default = "default_penalty")]
    pub restart_penalty_s: f64,
    #[serde(default)]
    pub node_failures: Option<NodeFailures>,
    #[serde(default)]
    pub slowdowns: Option<Slowdowns>,
    /// Faults at set times (a fault trace), besides those drawn at random.
    #[serde(default)]
    pub faults: Vec<ScriptedFault>,
    /// How failures and slowdowns are noticed and handled.
    #[serde(default)]
    pub fault_handling: FaultHandling,
    /// How often training jobs save, and what a save costs them: a failure then takes a job
    /// back to its last save. `None`: no work is lost to a fault.
    #[serde(default)]
    pub checkpoint: Option<CheckpointModel>,
    /// Seed of every random draw (node failures and slowdowns).
    #[serde(default)]
    pub seed: u64,
    /// Simulated time after which the run stops; unfinished jobs have no finish time.
    #[serde(default)]
    pub max_time_s: Option<f64>,
}

fn default_round() -> f64 {
    60.0
}
fn default_penalty() -> f64 {
    30.0
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            round_s: default_round(),
            restart_penalty_s: default_penalty(),
            node_failures: None,
            slowdowns: None,
            faults: Vec::new(),
            fault_handling: FaultHandling::default(),
            checkpoint: None,
            seed: 0,
            max_time_s: None,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |m: String| Err(PolicyError::InvalidConfig(m));
        if !(self.round_s.is_finite() && self.round_s > 0.0) {
            return bad(format!("round_s is {}, expected > 0", self.round_s));
        }
        if !(self.restart_penalty_s.is_finite() && self.restart_penalty_s >= 0.0) {
            return bad(format!("restart_penalty_s is {}", self.restart_penalty_s));
        }
        super::faults::validate(
            self.node_failures.as_ref(),
            self.slowdowns.as_ref(),
            &self.faults,
            &self.fault_handling,
        )?;
        if let Some(c) = &self.checkpoint {
            c.validate()?;
        }
        if let Some(m) = self.max_time_s
            && !(m.is_finite() && m > 0.0)
        {
            return bad(format!("max_time_s is {m}"));
        }
        Ok(())
    }
}

/// What the caller of a replay hooks in: timing the scheduler (the simulator reads no clock)
/// and following progress.
pub trait SimHooks {
    /// Runs the scheduler on `snapshot`; returns its answer and the microseconds it took, where
    /// the caller measures (0 otherwise).
    fn decide(
        &mut self,
        scheduler: &dyn Scheduler,
        snapshot: &Snapshot,
    ) -> (Result<Assignment, PolicyError>, u64) {
        (scheduler.schedule(snapshot), 0)
    }

    /// After each round: the round and the jobs finished so far.
    fn after_round(&mut self, _round: &RoundRecord, _finished: usize) {}
}

impl SimHooks for () {}

/// Where [`replay`] puts its records as it makes them, so that a replay holds only the jobs in
/// the system: [`simulate`] collects them; `brainctl whatif --stream` writes them out.
pub trait ReplaySink {
    /// The caller's error: a simulation error, or one the sink or the trace's reader met.
    type Error: From<PolicyError>;
    /// A job's record: when it finishes, or at the end of the replay if it did not. `id` is
    /// its position in the trace.
    fn job(&mut self, id: usize, record: JobRecord) -> Result<(), Self::Error>;
    /// Each scheduling round, in order.
    fn round(&mut self, round: &RoundRecord) -> Result<(), Self::Error>;
}

/// What a replay knows only at its end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayEnd {
    /// GPU-seconds the nodes were up from the first submission to the last completion (or to
    /// the end of the last round in which an unfinished job held GPUs).
    pub gpu_seconds_up: f64,
}

/// Rounds in a row in which nothing runs, nothing is left to arrive and every node is up,
/// after which a replay stops with the waiting jobs unfinished.
const IDLE_ROUNDS: u32 = 1000;

/// Replays `trace` on `cluster` under `scheduler`, every job in memory, and returns the whole
/// report: the jobs in trace order, the rounds and the exact summary. Every job is checked
/// before the replay starts. See [`replay`] for when a replay stops.
pub fn simulate(
    trace: &[TraceJob],
    profiles: &[AppProfile],
    cluster: &ClusterSpec,
    scheduler: &dyn Scheduler,
    config: &SimConfig,
    hooks: &mut dyn SimHooks,
) -> Result<Report, PolicyError> {
    let setup = Setup::new(profiles, cluster, scheduler, config)?;
    for (i, j) in trace.iter().enumerate() {
        setup.admit(i, j.clone())?;
    }
    // Jobs in order of submission (ties by trace order); ids are trace positions.
    let mut order: Vec<usize> = (0..trace.len()).collect();
    order.sort_by(|&a, &b| {
        trace[a]
            .submit_s
            .total_cmp(&trace[b].submit_s)
            .then(a.cmp(&b))
    });
    let mut sink = Collect {
        jobs: vec![None; trace.len()],
        rounds: Vec::new(),
    };
    let end = replay(
        order.iter().map(|&i| Ok((i, trace[i].clone()))),
        profiles,
        cluster,
        scheduler,
        config,
        hooks,
        &mut sink,
    )?;
    let jobs: Vec<JobRecord> = sink
        .jobs
        .into_iter()
        .map(|j| j.expect("a replay records every job"))
        .collect();
    let report = Report {
        policy: scheduler.name().to_string(),
        summary: Summary::of(&jobs, end.gpu_seconds_up),
        jobs,
        rounds: sink.rounds,
        gpu_seconds_up: end.gpu_seconds_up,
    };
    // The utilisation column's GPU-seconds are the jobs' own.
    let held: f64 = report.jobs.iter().map(|j| j.gpu_seconds).sum();
    let u = report.summary.gpu_utilisation;
    if report.gpu_seconds_up > 0.0
        && (u * report.gpu_seconds_up - held).abs() > 1e-6 * held.max(1.0)
    {
        return Err(PolicyError::Invariant(format!(
            "utilisation {u} of {} GPU-seconds up, but the jobs held {held}",
            report.gpu_seconds_up
        )));
    }
    Ok(report)
}

/// [`simulate`]'s sink: every record, by trace position.
struct Collect {
    jobs: Vec<Option<JobRecord>>,
    rounds: Vec<RoundRecord>,
}

impl ReplaySink for Collect {
    type Error = PolicyError;

    fn job(&mut self, id: usize, record: JobRecord) -> Result<(), PolicyError> {
        self.jobs[id] = Some(record);
        Ok(())
    }

    fn round(&mut self, round: &RoundRecord) -> Result<(), PolicyError> {
        self.rounds.push(round.clone());
        Ok(())
    }
}

/// GPU-seconds up between the first submission and the last completion, summed round by round
/// as the replay goes. A round counts once the replay is known to be busy past its end; the
/// rounds since then wait (few: the replay is busy until its last completion) and count in part
/// at the end.
struct UpTime {
    first_s: f64,
    round_s: f64,
    sum: f64,
    busy_to: f64,
    waiting: std::collections::VecDeque<(f64, u32)>,
}

impl UpTime {
    fn round(&mut self, t: f64, gpus_up: u32) {
        self.waiting.push_back((t, gpus_up));
        self.settle();
    }

    fn busy_to(&mut self, s: f64) {
        self.busy_to = self.busy_to.max(s);
        self.settle();
    }

    fn settle(&mut self) {
        while let Some(&(t, g)) = self.waiting.front()
            && t + self.round_s <= self.busy_to
        {
            self.sum += self.part(t, g);
            self.waiting.pop_front();
        }
    }

    /// The GPU-seconds of the round at `t` between the first submission and `busy_to`.
    fn part(&self, t: f64, gpus_up: u32) -> f64 {
        let (a, b) = (t.max(self.first_s), (t + self.round_s).min(self.busy_to));
        gpus_up as f64 * (b - a).max(0.0)
    }

    fn total(mut self) -> f64 {
        for (t, g) in std::mem::take(&mut self.waiting) {
            self.sum += self.part(t, g);
        }
        self.sum
    }
}

/// A job's record: `contention` is the jobs in the system summed over the first `rounds`
/// rounds, the finishing one included when the job finished after its start.
fn record(
    j: &JobState,
    config: &SimConfig,
    rounds: usize,
    contention: f64,
    unfinished: Option<Unfinished>,
) -> JobRecord {
    let rho = j.finished.zip(j.alone_s).and_then(|(finish, alone)| {
        let jct = finish - j.trace.submit_s;
        let sharing = if rounds > j.arrived_round {
            ((contention - j.arrived_contention) / (rounds - j.arrived_round) as f64).max(1.0)
        } else {
            1.0
        };
        (alone > 0.0).then(|| jct / (sharing * alone))
    });
    JobRecord {
        name: j.trace.name.clone(),
        application: j.trace.label().to_string(),
        submit_s: j.trace.submit_s,
        start_s: j.started,
        finish_s: j.finished,
        restarts: j.restarts,
        gpu_seconds: j.attained,
        restart_gpu_seconds: j.restarting,
        training_s: j.training_s,
        stalled_gpu_seconds: j.stalled,
        faults: j.faults,
        lost_training_s: j.lost_training_s,
        saving_gpu_seconds: j.saving,
        requested_replicas: j.trace.requested_replicas,
        peak_replicas: j.peak,
        rho,
        unfinished,
        account: j.jct_account(config),
    }
}

/// Replays the jobs of a trace, given in order of submission with their positions in the trace,
/// on `cluster` under `scheduler`, and hands each job's record to `sink` when the job finishes
/// and each round's when it ends. It holds only the jobs submitted and not finished, and the
/// next to arrive: memory follows the jobs in the system, not the trace's length.
///
/// A replay stops when every job has finished, at `max_time_s`, or when the scheduler leaves
/// the jobs waiting on an idle cluster for `IDLE_ROUNDS` rounds (a job that can never fit);
/// unfinished jobs, those yet to arrive included, have no finish time. A job submitted before
/// the one ahead of it is an error.
pub fn replay<S: ReplaySink>(
    trace: impl IntoIterator<Item = Result<(usize, TraceJob), S::Error>>,
    profiles: &[AppProfile],
    cluster: &ClusterSpec,
    scheduler: &dyn Scheduler,
    config: &SimConfig,
    hooks: &mut dyn SimHooks,
    sink: &mut S,
) -> Result<ReplayEnd, S::Error> {
    let setup = Setup::new(profiles, cluster, scheduler, config)?;
    let world = &setup.world;
    let elastic = setup.elastic;
    let mut arrivals = Arrivals {
        source: trace.into_iter(),
        last_submit_s: f64::NEG_INFINITY,
    };
    // The next job to arrive.
    let mut next = arrivals.next(&setup)?;
    let round = config.round_s;
    let mut up = UpTime {
        first_s: next.as_ref().map_or(f64::INFINITY, |j| j.trace.submit_s),
        round_s: round,
        sum: 0.0,
        busy_to: f64::NEG_INFINITY,
        waiting: Default::default(),
    };
    let mut rng = Pcg64::seed_from_u64(config.seed);
    let mut faults = NodeFaults::new(cluster.nodes.len(), &config.faults)?;
    let node_gpus: Vec<u32> = cluster.nodes.iter().map(|n| n.gpus).collect();
    let worker_types: Vec<WorkerType> = setup.types.iter().cloned().map(WorkerType).collect();
    let mut finished = 0;
    let mut t = 0.0f64;
    let mut idle_rounds = 0;
    // Why the loop ended with jobs unfinished, if it did.
    let mut ended = None;
    // Rounds recorded, and the jobs in the system summed over them.
    let mut rounds = 0usize;
    let mut contention = 0.0f64;
    // GPU-seconds the jobs held, for the capacity invariant.
    let mut held_total = 0.0f64;
    // Jobs submitted and not finished, in order of submission.
    let mut active: Vec<JobState> = Vec::new();
    loop {
        if active.is_empty() && next.is_none() {
            break;
        }
        if config.max_time_s.is_some_and(|m| t >= m) {
            ended = Some(Unfinished::Cut);
            break;
        }
        while let Some(mut job) = next.take_if(|j| j.trace.submit_s <= t) {
            job.arrived_round = rounds;
            job.arrived_contention = contention;
            active.push(job);
            next = arrivals.next(&setup)?;
        }
        if active.is_empty() {
            // Nothing to do until the next arrival's round.
            let next_s = next.as_ref().expect("a job is left").trace.submit_s;
            t = (next_s / round).ceil() * round;
            continue;
        }
        // Faults at the round boundary.
        for hit in faults.round(t, round, &node_gpus, config, &mut rng) {
            strike(&mut active, hit, config.checkpoint.is_some());
        }
        let snapshot = snapshot_at(
            t,
            &mut active,
            &faults,
            world,
            cluster,
            &worker_types,
            elastic,
        );
        let (answer, decide_us) = hooks.decide(scheduler, &snapshot);
        let assignment = answer?;
        check(&snapshot, &assignment)?;
        let mut changed = 0;
        for job in active.iter_mut().filter(|j| j.stall_left == 0.0) {
            let new = assignment
                .get(&JobId(job.id as u64))
                .cloned()
                .unwrap_or_default();
            if new == job.slots {
                continue;
            }
            changed += 1;
            job.last_change = Some(t);
            if new.is_empty() {
                job.slots.clear();
                job.rescale_left = 0.0;
                continue;
            }
            if job.started.is_some() {
                job.restarts += 1;
            } else {
                job.started = Some(t);
            }
            let ty = world.node_type[new[0].0];
            let held: u32 = new.iter().map(|s| s.1).sum();
            job.worker_type = Some(ty);
            job.peak = job.peak.max(held);
            job.rescale_left = config.restart_penalty_s;
            job.slots = new;
            if let Some(app) = job.app
                && let Some(gpu) = world.gpu[app][ty]
            {
                let digits: Vec<u32> = job.slots.iter().map(|s| s.1).collect();
                job.config = world.config_on(job, gpu, &digits, &world.apps[app]).0;
            }
        }
        // Invariant: no node holds more GPUs than it has up (GPUs are only given back within
        // a round, so this holds at every instant of it).
        let up_now: Vec<u32> = (0..node_gpus.len())
            .map(|n| faults.gpus_up(n, t, node_gpus[n]))
            .collect();
        let mut held = vec![0u32; cluster.nodes.len()];
        for job in &active {
            for &(n, k) in &job.slots {
                held[n] += k;
            }
        }
        if let Some(n) = (0..held.len()).find(|&n| held[n] > up_now[n]) {
            return Err(PolicyError::Invariant(format!(
                "at {t} s node {n} holds {} GPUs of the {} it has up",
                held[n], up_now[n]
            ))
            .into());
        }
        let gpus_used: u32 = held.iter().sum();
        // GPUs of each type up and held by no job this round.
        let mut idle = vec![0u32; setup.types.len()];
        for (n, (&h, &u)) in held.iter().zip(&up_now).enumerate() {
            idle[world.node_type[n]] += u - h;
        }
        let record_now = RoundRecord {
            time_s: t,
            active_jobs: active.len() as u32,
            queued_jobs: active.iter().filter(|j| j.slots.is_empty()).count() as u32,
            gpus_used,
            gpus_up: up_now.iter().sum(),
            changed_jobs: changed,
            decide_us,
        };
        // Nothing runs, nothing will arrive, every node is up: a scheduler may wait a round
        // on purpose (Pollux does not start a job in the instant it arrives), but one that
        // runs nothing for IDLE_ROUNDS such rounds never will.
        if gpus_used == 0
            && next.is_none()
            && !faults.any_out(t)
            && active.iter().all(|j| j.stall_left == 0.0)
        {
            idle_rounds += 1;
        } else {
            idle_rounds = 0;
        }
        let stuck = idle_rounds >= IDLE_ROUNDS;
        for job in &mut active {
            let speed = job
                .slots
                .iter()
                .map(|s| faults.speed(s.0))
                .fold(1.0, f64::min);
            world.advance(job, t, round, speed, config.checkpoint.as_ref(), &idle);
            if job.finished.is_some() {
                finished += 1;
            }
        }
        up.round(t, record_now.gpus_up);
        if active
            .iter()
            .any(|j| j.finished.is_none() && !j.slots.is_empty())
        {
            up.busy_to(t + round);
        }
        let contention_before = contention;
        rounds += 1;
        contention += record_now.active_jobs as f64;
        for job in active.extract_if(.., |j| j.finished.is_some()) {
            check_job(&job, config)?;
            let finish = job.finished.expect("finished");
            up.busy_to(finish);
            held_total += job.attained;
            // A job that finished in the instant its round began (a float's last digit) did
            // not share that round.
            let r = if t < finish {
                record(&job, config, rounds, contention, None)
            } else {
                record(&job, config, rounds - 1, contention_before, None)
            };
            sink.job(job.id, r)?;
        }
        hooks.after_round(&record_now, finished);
        sink.round(&record_now)?;
        if stuck {
            // Every node is up, nothing will arrive, and the scheduler runs nothing: it never will.
            ended = Some(Unfinished::NeverPlaced);
            break;
        }
        t += round;
    }
    let why = |j: &JobState| match ended {
        Some(Unfinished::NeverPlaced) if j.started.is_some() => Unfinished::Stranded,
        why => why.expect("the loop ends early only with a reason"),
    };
    for job in active.drain(..) {
        held_total += job.attained;
        sink.job(
            job.id,
            record(&job, config, rounds, contention, Some(why(&job))),
        )?;
    }
    // A replay cut short: the jobs yet to arrive did not finish either.
    while let Some(job) = next {
        sink.job(
            job.id,
            record(&job, config, rounds, contention, Some(why(&job))),
        )?;
        next = arrivals.next(&setup)?;
    }
    let gpu_seconds_up = up.total();
    if held_total > gpu_seconds_up * (1.0 + 1e-9) + 1e-6 {
        return Err(PolicyError::Invariant(format!(
            "the jobs held {held_total} GPU-seconds, more than the {gpu_seconds_up} the nodes \
             were up"
        ))
        .into());
    }
    Ok(ReplayEnd { gpu_seconds_up })
}

/// What the scheduler sees at `t`: the jobs in the system but those stalled by a fault not yet
/// noticed, and each node's GPUs up less those the stalled jobs hold.
fn snapshot_at(
    t: f64,
    active: &mut [JobState],
    faults: &NodeFaults,
    world: &super::world::World,
    cluster: &ClusterSpec,
    worker_types: &[WorkerType],
    elastic: bool,
) -> Snapshot {
    let mut stalled = vec![0u32; cluster.nodes.len()];
    for job in active.iter().filter(|j| j.stall_left > 0.0) {
        for &(n, k) in &job.slots {
            stalled[n] += k;
        }
    }
    let nodes = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(n, spec)| NodeView {
            worker_type: world.node_type[n],
            gpus: faults.gpus_up(n, t, spec.gpus).saturating_sub(stalled[n]),
        })
        .collect();
    let jobs = active
        .iter_mut()
        .filter(|j| j.stall_left == 0.0)
        .map(|job| {
            let id = JobId(job.id as u64);
            world.view(job, id, elastic)
        })
        .collect();
    Snapshot {
        now_s: t,
        worker_types: worker_types.to_vec(),
        nodes,
        jobs,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::schedule::{
        BatchSizing, DlRover, ElasticLp, Fifo, Gavel, Optimus, Pollux, SchedulerKind, Tiresias,
    };
    use crate::sim::Work;
    use crate::sim::app::{App, tests::toy_profile};

    pub(crate) fn job(name: &str, submit_s: f64, replicas: u32, batch: u32) -> TraceJob {
        TraceJob {
            name: name.into(),
            submit_s,
            requested_replicas: replicas,
            work: Work::Train {
                application: "toy".into(),
                batch_size: batch,
            },
        }
    }

    pub(crate) fn all() -> Vec<SchedulerKind> {
        vec![
            SchedulerKind::Fifo(Fifo::default()),
            SchedulerKind::Tiresias(Tiresias::default()),
            SchedulerKind::Optimus(Optimus::default()),
            SchedulerKind::Pollux(Pollux::default()),
            SchedulerKind::ElasticLp(ElasticLp::default()),
            SchedulerKind::Gavel(Gavel::default()),
            SchedulerKind::Dlrover(DlRover::default()),
        ]
    }

    #[test]
    fn a_lone_job_finishes_after_its_restart_penalty_and_its_work() {
        // Batch 8 on one GPU: a step takes 0.18 s and is worth 1; 400 steps of progress.
        let trace = [job("a", 30.0, 1, 8)];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let r = simulate(
            &trace,
            &[toy_profile()],
            &cluster,
            &Fifo::default(),
            &SimConfig::default(),
            &mut (),
        )
        .unwrap();
        let j = &r.jobs[0];
        // Submitted at 30 s, first round after that at 60 s, 30 s restart penalty, 72 s of work.
        assert_eq!(j.start_s, Some(60.0));
        assert!(
            (j.finish_s.unwrap() - (60.0 + 30.0 + 72.0)).abs() < 1e-6,
            "{j:?}"
        );
        assert!((j.gpu_seconds - 102.0).abs() < 1e-6);
        // Its one GPU held through the 30 s start-up, which made no progress.
        assert!((j.restart_gpu_seconds - 30.0).abs() < 1e-6, "{j:?}");
        assert!((r.summary.restart_gpu_share - 30.0 / 102.0).abs() < 1e-9);
        assert_eq!(r.summary.finished, 1);
        assert!((r.summary.mean_jct_s - 132.0).abs() < 1e-6);
        // Alone it had the whole cluster: exactly its fair share.
        assert!((j.rho.unwrap() - 1.0).abs() < 1e-9, "{j:?}");
        assert_eq!(r.summary.unfair_share, 0.0);
    }

    #[test]
    fn finish_time_fairness_compares_a_job_with_its_share_of_the_cluster() {
        // Two jobs that each need the whole cluster for 600 s, submitted together, FIFO: the
        // first is done at 630 (30 s penalty + 600 s), its fair share 2 × 630 s: ρ = 0.5. The
        // second starts at the next round, 660, and ends at 1,290, having shared the cluster
        // with 2 jobs in 11 of its 22 rounds and with none in the other 11: ρ = 1,290 / (1.5 ×
        // 630).
        let trace = [rigid("a", 0.0, 4, 600.0), rigid("b", 0.0, 4, 600.0)];
        let r = simulate(
            &trace,
            &[],
            &ClusterSpec::uniform(1, 4, "t4"),
            &Fifo::default(),
            &SimConfig::default(),
            &mut (),
        )
        .unwrap();
        let rho: Vec<f64> = r.jobs.iter().map(|j| j.rho.unwrap()).collect();
        assert!((rho[0] - 0.5).abs() < 1e-9, "{rho:?}");
        let b = 1290.0 / (1.5 * 630.0);
        assert!((rho[1] - b).abs() < 1e-9, "{rho:?} vs {b}");
        assert_eq!(r.summary.unfair_share, 0.5);
        assert_eq!(r.summary.max_rho, rho[1]);
    }

    #[test]
    fn a_job_preempted_and_restarted_pays_the_penalty_again() {
        // Tiresias demotes after 60 GPU-seconds, on one GPU. a runs 0..60 (30 s penalty, then
        // 30 of its 72 s of work), is demoted and yields to b, which is
        // demoted in turn at 120; a comes back first (earlier in the low queue), pays 30 s
        // again (120–150) and needs its other 42 s: done at 192. b resumes at 240 with 42 s
        // left after another 30 s restart: done at 312.
        let trace = [job("a", 0.0, 1, 8), job("b", 60.0, 1, 8)];
        let cluster = ClusterSpec::uniform(1, 1, "t4");
        let t = Tiresias {
            queue_threshold_gpu_s: 60.0,
        };
        let r = simulate(
            &trace,
            &[toy_profile()],
            &cluster,
            &t,
            &SimConfig::default(),
            &mut (),
        )
        .unwrap();
        assert_eq!(
            (r.jobs[0].restarts, r.jobs[1].restarts),
            (1, 1),
            "{:?}",
            r.jobs
        );
        assert!(
            (r.jobs[0].finish_s.unwrap() - 192.0).abs() < 1e-6,
            "{:?}",
            r.jobs[0]
        );
        assert!(
            (r.jobs[1].finish_s.unwrap() - 312.0).abs() < 1e-6,
            "{:?}",
            r.jobs[1]
        );
        assert_eq!(r.summary.restarts, 2);
        // Each started twice on one GPU: 60 GPU-seconds of restarts each, of 132 held.
        let restarting: Vec<f64> = r.jobs.iter().map(|j| j.restart_gpu_seconds).collect();
        assert!(
            restarting.iter().all(|s| (s - 60.0).abs() < 1e-6),
            "{restarting:?}"
        );
        assert!(r.jobs.iter().all(|j| (j.gpu_seconds - 132.0).abs() < 1e-6));
        assert!((r.summary.restart_gpu_share - 120.0 / 264.0).abs() < 1e-9);
        // Where their time went: a waits 60–120 and b 120–240 without GPUs, each pays one
        // restart after its first start, and each trains its 72 s on the one GPU there is.
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        for (j, waits) in r.jobs.iter().zip([60.0, 120.0]) {
            let a = j.account;
            assert!(near(a.floor_s, 30.0) && near(a.queue_s, 0.0), "{a:?}");
            assert!(near(a.waits_s, waits) && near(a.restarts_s, 30.0), "{a:?}");
            // At batch 8 (Tiresias does not adapt it): what the best batch saves is `batch_s`.
            assert!(near(a.least_s + a.batch_s, 72.0), "{a:?}");
            assert!(near(
                a.sharing_s + a.type_s + a.spread_s + a.slow_s + a.faults_s,
                0.0
            ));
            assert!(near(a.total(), j.jct_s().unwrap()), "{a:?}");
        }
    }

    #[test]
    fn a_job_that_can_never_fit_stops_the_replay_instead_of_spinning() {
        let trace = [job("huge", 0.0, 64, 8)];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        // FIFO clamps the request to the cluster's size, so it runs on 4.
        let r = simulate(
            &trace,
            &[toy_profile()],
            &cluster,
            &Fifo::default(),
            &SimConfig::default(),
            &mut (),
        )
        .unwrap();
        assert_eq!(r.summary.finished, 1);
        let bad = [TraceJob {
            work: Work::Train {
                application: "nope".into(),
                batch_size: 8,
            },
            ..job("x", 0.0, 1, 8)
        }];
        let e = simulate(
            &bad,
            &[toy_profile()],
            &cluster,
            &Fifo::default(),
            &SimConfig::default(),
            &mut (),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("job x: no profile for application \"nope\""),
            "{e}"
        );
        let wrong_type = ClusterSpec::uniform(1, 4, "v100");
        let e = simulate(
            &trace,
            &[toy_profile()],
            &wrong_type,
            &Fifo::default(),
            &SimConfig::default(),
            &mut (),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("no measurements on any GPU type of the cluster (v100)"),
            "{e}"
        );
    }

    #[test]
    fn a_replay_whose_numbers_would_be_wrong_is_an_error() {
        // At 1e300 s a round of 60 s no longer moves the clock: the job would "finish" in 0 s.
        // (`brainctl whatif` refuses such a trace at load; the engine must not report it.)
        for trace in [[rigid("far", 1e300, 1, 600.0)], [job("far", 1e300, 1, 8)]] {
            let e = simulate(
                &trace,
                &[toy_profile()],
                &ClusterSpec::uniform(1, 4, "t4"),
                &Fifo::default(),
                &SimConfig::default(),
                &mut (),
            )
            .unwrap_err();
            assert!(
                matches!(&e, PolicyError::Invariant(m) if m.contains("job far finished in 0 s")),
                "{e}"
            );
        }
    }

    /// Places job 0 on node 0 in the first round it sees it and nothing else, ever.
    struct OnlyOnce;

    impl Scheduler for OnlyOnce {
        fn name(&self) -> &'static str {
            "only-once"
        }
        fn elastic(&self) -> bool {
            false
        }
        fn schedule(&self, s: &Snapshot) -> Result<Assignment, PolicyError> {
            Ok(s.jobs
                .iter()
                .filter(|j| j.id == JobId(0) && s.now_s == 0.0)
                .map(|j| (j.id, vec![(0, j.requested_replicas)]))
                .collect())
        }
    }

    #[test]
    fn a_job_the_replay_never_finished_says_why_and_stays_out_of_the_jct_figures() {
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        // `a` runs in round 0 only (30 s penalty, then 30 s of its 600 s) and is never placed
        // again; `b` never runs at all.
        let trace = [rigid("a", 0.0, 2, 600.0), rigid("b", 0.0, 2, 60.0)];
        let r = simulate(
            &trace,
            &[],
            &cluster,
            &OnlyOnce,
            &SimConfig::default(),
            &mut (),
        )
        .unwrap();
        let why: Vec<_> = r.jobs.iter().map(|j| j.unfinished).collect();
        assert_eq!(
            why,
            [Some(Unfinished::Stranded), Some(Unfinished::NeverPlaced)]
        );
        assert_eq!(r.summary.finished, 0);
        assert!(r.summary.mean_jct_s.is_nan() && r.summary.mean_queueing_s.is_nan());
        assert_eq!(
            r.summary.unfinished.values().sum::<u32>(),
            2,
            "{:?}",
            r.summary
        );
        // A cut replay: `b` finishes (FIFO, 30 s + 60 s), `a` is still running at 300 s.
        let config = SimConfig {
            max_time_s: Some(300.0),
            ..SimConfig::default()
        };
        let r = simulate(&trace, &[], &cluster, &Fifo::default(), &config, &mut ()).unwrap();
        let why: Vec<_> = r.jobs.iter().map(|j| j.unfinished).collect();
        assert_eq!(why, [Some(Unfinished::Cut), None]);
        assert_eq!(r.summary.finished, 1);
        assert_eq!(r.summary.mean_jct_s, 90.0);
        assert_eq!(r.summary.mean_queueing_s, 0.0);
        assert_eq!(r.summary.unfinished.get(&Unfinished::Cut), Some(&1));
    }

    #[test]
    fn a_streamed_trace_out_of_order_or_failing_to_read_is_an_error() {
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let run = |jobs: Vec<Result<(usize, TraceJob), PolicyError>>| {
            let mut sink = Collect {
                jobs: vec![None; 3],
                rounds: Vec::new(),
            };
            replay(
                jobs,
                &[],
                &cluster,
                &Fifo::default(),
                &SimConfig::default(),
                &mut (),
                &mut sink,
            )
        };
        let e = run(vec![
            Ok((0, rigid("a", 100.0, 1, 10.0))),
            Ok((1, rigid("b", 50.0, 1, 10.0))),
        ])
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("job b: submitted at 50 s, before the job ahead")
                && e.to_string().contains("in order of submission"),
            "{e}"
        );
        // The reader's own error comes through as it is.
        let e = run(vec![
            Ok((0, rigid("a", 0.0, 1, 10.0))),
            Err(PolicyError::InvalidConfig("line 3: unreadable".into())),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("line 3: unreadable"), "{e}");
        // In order, ties too: fine.
        let end = run(vec![
            Ok((0, rigid("a", 0.0, 1, 10.0))),
            Ok((1, rigid("b", 0.0, 1, 10.0))),
            Ok((2, rigid("c", 70.0, 1, 10.0))),
        ])
        .unwrap();
        // a and b run 0-40 (30 s penalty, 10 s); at 60 nothing is in the system, so the next
        // round is c's, at 120, done at 160: 4 GPUs up in the rounds at 0 (60 s) and 120 (to
        // 160, the last completion).
        assert_eq!(end.gpu_seconds_up, 4.0 * 60.0 + 4.0 * 40.0);
    }

    pub(crate) fn rigid(name: &str, submit_s: f64, replicas: u32, duration_s: f64) -> TraceJob {
        TraceJob {
            name: name.into(),
            submit_s,
            requested_replicas: replicas,
            work: Work::Rigid {
                duration_s,
                label: "vc".into(),
            },
        }
    }

    #[test]
    fn a_rigid_job_runs_on_exactly_its_gpus_for_its_duration() {
        // 4 GPUs: `a` takes 2 at 0 s, `b` needs all 4 and waits for `a`: 30 s penalty + 100 s,
        // then the next round at 180 s, 30 s + 50 s.
        let trace = [rigid("a", 0.0, 2, 100.0), rigid("b", 0.0, 4, 50.0)];
        let cluster = ClusterSpec::uniform(1, 4, "t4");
        let run = |s: &dyn Scheduler| {
            simulate(&trace, &[], &cluster, s, &SimConfig::default(), &mut ()).unwrap()
        };
        let r = run(&Fifo::default());
        let done: Vec<_> = r.jobs.iter().map(|j| (j.start_s, j.finish_s)).collect();
        assert_eq!(done, [(Some(0.0), Some(130.0)), (Some(180.0), Some(260.0))]);
        assert_eq!(r.jobs[0].application, "vc");
        assert_eq!(r.jobs[1].gpu_seconds, 4.0 * 80.0);
        // Elastic schedulers neither shrink nor grow it.
        for s in all() {
            let r = run(&s);
            assert_eq!(r.summary.finished, 2, "{}", s.name());
            for j in &r.jobs {
                assert_eq!(j.peak_replicas, j.requested_replicas, "{}: {j:?}", s.name());
            }
        }
        let too_big = [rigid("c", 0.0, 8, 10.0)];
        let e = simulate(
            &too_big,
            &[],
            &cluster,
            &Fifo::default(),
            &SimConfig::default(),
            &mut (),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("job c: a rigid job on 8 GPUs does not fit"),
            "{e}"
        );
    }

    pub(crate) fn arb_trace() -> impl Strategy<Value = Vec<TraceJob>> {
        proptest::collection::vec(
            (
                0.0f64..2000.0,
                1u32..9,
                prop::sample::select(vec![8u32, 16, 32, 64]),
                prop::option::weighted(0.3, 1.0f64..3000.0),
            ),
            1..12,
        )
        .prop_map(|jobs| {
            jobs.into_iter()
                .enumerate()
                .map(|(i, (t, r, b, rigid_s))| match rigid_s {
                    Some(d) => rigid(&format!("r{i}"), t.floor(), r, d.floor()),
                    None => job(&format!("j{i}"), t.floor(), r, b),
                })
                .collect()
        })
    }

    /// The least seconds a `toy` job of total batch `batch` can train for on `nodes` nodes of
    /// 4 T4: each epoch at the best goodput of any placement of any size on the whole cluster
    /// (every per-node count), at the batch size the scheduler's sizing gives it there.
    pub(crate) fn fastest_toy_s(nodes: usize, batch: u32, sizing: BatchSizing) -> f64 {
        let app = App::new(&toy_profile()).unwrap();
        let mut placements: Vec<Vec<u32>> = vec![Vec::new()];
        for _ in 0..nodes {
            placements = placements
                .into_iter()
                .flat_map(|p| {
                    (0..=4).map(move |k| {
                        let mut q = p.clone();
                        q.push(k);
                        q
                    })
                })
                .collect();
        }
        placements.retain(|p| p.iter().any(|&k| k > 0));
        (0..app.max_epochs)
            .map(|e| {
                let best = placements
                    .iter()
                    .map(|p| {
                        let digits: Vec<u32> = p.iter().copied().filter(|&k| k > 0).collect();
                        let r: u32 = digits.iter().sum();
                        match sizing {
                            BatchSizing::Adaptive => app.best_config(0, &digits, e).1,
                            BatchSizing::Fixed => {
                                let b = batch.clamp(app.init_batch_size, app.max_batch_size);
                                app.goodput(0, &digits, app.fixed_config(r, b), e)
                            }
                        }
                    })
                    .fold(0.0, f64::max);
                (app.progress_at(e + 1) - app.progress_at(e)) / best
            })
            .sum()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Under every scheduler, with node failures (crashes and hangs) and slowdowns, detected
        /// or waited out: no round uses more GPUs than are up, every
        /// job finishes exactly once after it was submitted, a rigid job only ever holds what
        /// it asked for and runs at least its duration, and the same seed gives the same
        /// report.
        #[test]
        fn capacity_holds_and_every_job_finishes_once(trace in arb_trace(), seed in 0u64..1000) {
            let cluster = ClusterSpec::uniform(3, 4, "t4");
            let config = SimConfig {
                node_failures: Some(NodeFailures {
                    mtbf_s: 20_000.0,
                    repair_s: 600.0,
                    per_gpu: false,
                    hang_share: 0.5,
                }),
                slowdowns: Some(Slowdowns { mtbs_s: 20_000.0, factor: 0.5, duration_s: 900.0 }),
                fault_handling: FaultHandling {
                    handling: if seed % 2 == 0 { Handling::DetectAndIsolate } else { Handling::WaitForCrash },
                    hang_timeout_s: 300.0,
                    ..FaultHandling::default()
                },
                // Failures then take training jobs back to their last save.
                checkpoint: (seed % 3 != 0).then_some(CheckpointModel { every_s: 120.0, save_s: 2.0 }),
                seed,
                ..SimConfig::default()
            };
            // Each training job's fastest possible time, at fixed and at adapted batch sizes.
            let fastest: Vec<[f64; 2]> = trace
                .iter()
                .map(|t| match t.work {
                    Work::Train { batch_size, .. } => [BatchSizing::Fixed, BatchSizing::Adaptive]
                        .map(|b| fastest_toy_s(3, batch_size, b)),
                    Work::Rigid { .. } => [0.0; 2],
                })
                .collect();
            for s in all() {
                let r = simulate(&trace, &[toy_profile()], &cluster, &s, &config, &mut ()).unwrap();
                for round in &r.rounds {
                    prop_assert!(round.gpus_used <= round.gpus_up, "{}: {round:?}", s.name());
                }
                prop_assert_eq!(r.summary.finished as usize, trace.len(), "{}", s.name());
                for ((j, t), fastest) in r.jobs.iter().zip(&trace).zip(&fastest) {
                    prop_assert!(j.start_s.unwrap() >= j.submit_s && j.finish_s.unwrap() > j.start_s.unwrap());
                    if let Work::Rigid { duration_s, .. } = t.work {
                        prop_assert_eq!(j.peak_replicas, t.requested_replicas, "{}", s.name());
                        prop_assert!(j.finish_s.unwrap() - j.start_s.unwrap() >= duration_s);
                        prop_assert!(j.gpu_seconds >= duration_s * t.requested_replicas as f64 - 1e-6);
                        // No faster than the whole cluster allows: the next round, a restart,
                        // its duration.
                        let wait = (t.submit_s / 60.0).ceil() * 60.0 - t.submit_s;
                        prop_assert!(j.jct_s().unwrap() >= wait + 30.0 + duration_s - 1e-6);
                    }
                    if let Work::Train { .. } = t.work {
                        // No faster than its fastest possible time on the whole cluster.
                        let wait = (t.submit_s / 60.0).ceil() * 60.0 - t.submit_s;
                        let k = usize::from(s.batch_sizing() == BatchSizing::Adaptive);
                        let least = wait + 30.0 + fastest[k];
                        prop_assert!(
                            j.jct_s().unwrap() >= least - 1e-6,
                            "{}: {} finished in {:?} s, fastest possible {least} s",
                            s.name(), j.name, j.jct_s()
                        );
                    }
                    prop_assert_eq!(j.unfinished, None);
                    // Work is lost to failures only with a checkpoint model, and never more
                    // than the job trained.
                    prop_assert!(j.lost_training_s >= 0.0, "{j:?}");
                    if config.checkpoint.is_none() {
                        prop_assert_eq!(j.lost_training_s, 0.0);
                    }
                    // Each start pays the penalty once at most, on no more than its peak GPUs,
                    // within what it held.
                    let starts = (j.restarts + 1) as f64;
                    let most = starts * config.restart_penalty_s * j.peak_replicas as f64;
                    prop_assert!(j.restart_gpu_seconds > 0.0, "{}: {j:?}", s.name());
                    prop_assert!(j.restart_gpu_seconds <= most + 1e-6, "{}: {j:?}", s.name());
                    prop_assert!(j.restart_gpu_seconds < j.gpu_seconds, "{}: {j:?}", s.name());
                }
                // The utilisation column's GPU-seconds are the jobs' own, and no more than were up.
                let held: f64 = r.jobs.iter().map(|j| j.gpu_seconds).sum();
                prop_assert!((r.summary.gpu_utilisation * r.gpu_seconds_up - held).abs() < 1e-6 * held.max(1.0));
                prop_assert!(r.summary.gpu_utilisation <= 1.0 + 1e-9, "{}: {:?}", s.name(), r.summary);
                let again = simulate(&trace, &[toy_profile()], &cluster, &s, &config, &mut ()).unwrap();
                prop_assert_eq!(&again, &r);
            }
        }

        /// A streamed replay hands each job to its sink once: a finished job in the round it
        /// finished (before that round's record), the others after the last round; and what
        /// it hands over is what `simulate` collects, cut short or not.
        #[test]
        fn a_streamed_replay_hands_each_record_over_once_as_it_is_made(
            trace in arb_trace(),
            cut in prop::option::of(60.0f64..6000.0),
        ) {
            /// Each job with the rounds handed over before it.
            #[derive(Default)]
            struct Handed {
                jobs: Vec<(usize, JobRecord, usize)>,
                rounds: Vec<RoundRecord>,
            }
            impl ReplaySink for Handed {
                type Error = PolicyError;
                fn job(&mut self, id: usize, record: JobRecord) -> Result<(), PolicyError> {
                    self.jobs.push((id, record, self.rounds.len()));
                    Ok(())
                }
                fn round(&mut self, round: &RoundRecord) -> Result<(), PolicyError> {
                    self.rounds.push(round.clone());
                    Ok(())
                }
            }
            let cluster = ClusterSpec::uniform(2, 4, "t4");
            let config = SimConfig { max_time_s: cut, ..SimConfig::default() };
            let mut order: Vec<usize> = (0..trace.len()).collect();
            order.sort_by(|&a, &b| trace[a].submit_s.total_cmp(&trace[b].submit_s).then(a.cmp(&b)));
            for s in all() {
                let whole = simulate(&trace, &[toy_profile()], &cluster, &s, &config, &mut ()).unwrap();
                let mut handed = Handed::default();
                let end = replay(
                    order.iter().map(|&i| Ok((i, trace[i].clone()))),
                    &[toy_profile()], &cluster, &s, &config, &mut (), &mut handed,
                ).unwrap();
                prop_assert_eq!(end.gpu_seconds_up, whole.gpu_seconds_up);
                prop_assert_eq!(&handed.rounds, &whole.rounds);
                for (_, j, before) in &handed.jobs {
                    match j.finish_s {
                        // Handed over in the round it finished in, just before that round.
                        Some(f) => {
                            let r = &handed.rounds[*before];
                            prop_assert!(r.time_s < f && f <= r.time_s + 60.0 + 1e-6, "{}: {j:?} at {r:?}", s.name());
                        }
                        None => prop_assert_eq!(*before, handed.rounds.len(), "{}: {:?}", s.name(), j),
                    }
                }
                let mut by_id = handed.jobs.clone();
                by_id.sort_by_key(|(id, _, _)| *id);
                prop_assert_eq!(by_id.iter().map(|(id, _, _)| *id).collect::<Vec<_>>(), (0..trace.len()).collect::<Vec<_>>());
                let records: Vec<JobRecord> = by_id.into_iter().map(|(_, j, _)| j).collect();
                prop_assert_eq!(&records, &whole.jobs);
            }
        }

        /// A replay cut at any time: every job either finished within it or is unfinished
        /// because of the cut, the JCT figures count only the finished, and the utilisation
        /// still covers every GPU-second held (the busy time after the last completion too).
        #[test]
        fn a_cut_replay_counts_only_what_finished(trace in arb_trace(), cut in 60.0f64..6000.0) {
            let cluster = ClusterSpec::uniform(2, 4, "t4");
            let config = SimConfig { max_time_s: Some(cut), ..SimConfig::default() };
            for s in all() {
                let r = simulate(&trace, &[toy_profile()], &cluster, &s, &config, &mut ()).unwrap();
                let done = r.jobs.iter().filter(|j| j.finish_s.is_some()).count();
                prop_assert_eq!(r.summary.finished as usize, done);
                for j in &r.jobs {
                    match j.finish_s {
                        Some(f) => prop_assert!(f <= cut + 60.0 && j.unfinished.is_none()),
                        None => prop_assert_eq!(j.unfinished, Some(Unfinished::Cut)),
                    }
                }
                prop_assert_eq!(
                    r.summary.unfinished.values().sum::<u32>() as usize,
                    trace.len() - done
                );
                prop_assert!(r.summary.gpu_utilisation <= 1.0 + 1e-9, "{}: {:?}", s.name(), r.summary);
            }
        }
    }
}
