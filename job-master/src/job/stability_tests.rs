//! Straggler and hang detection on simulated reports: a healthy group with step jitter is
//! never flagged (a soak of simulated hours), a slowed rank is flagged within three reports,
//! a silent group is found hung, its stacks asked for and the group restarted.

use super::stability::CAPTURE_WAIT_MS;
use super::tests::running;
use super::*;
use crate::spec::StragglerAction;

const REPORT_MS: u64 = 1000;

fn worker(index: u32) -> SlotKey {
    SlotKey {
        role: Role::WORKER,
        index,
    }
}

/// A small deterministic generator (xorshift64*), so a soak is the same on every run.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [-1, 1).
    fn symmetric(&mut self) -> f64 {
        2.0 * self.unit() - 1.0
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Each worker reports `steps` steps of `base_ms` each, times its own slowdown, times the
/// jitter of each step; returns the report numbers at which each worker was first flagged.
fn soak(
    ctx: &mut JobContext,
    reports: u64,
    steps: u32,
    jitter: &mut dyn FnMut() -> f64,
    slowdown: impl Fn(u32, u64) -> f64,
) -> BTreeMap<u32, u64> {
    let workers: Vec<u32> = ctx.roles.slots().map(|s| s.key).map(|k| k.index).collect();
    let mut flagged = BTreeMap::new();
    for r in 1..=reports {
        for &w in &workers {
            let compute_ms: f64 = (0..steps)
                .map(|_| 50.0 * slowdown(w, r) * (1.0 + jitter()))
                .sum();
            let m = MetricsRecord {
                global_step: r * steps as u64,
                steps,
                compute_seconds: compute_ms / 1000.0,
                ..Default::default()
            };
            ctx.report_metrics(worker(w), 1, m, None, None, r * REPORT_MS)
                .unwrap();
            if ctx.stability.stragglers.contains_key(&worker(w)) {
                flagged.entry(w).or_insert(r);
            }
        }
    }
    flagged
}

#[test]
fn a_healthy_group_with_ten_percent_step_jitter_is_never_flagged() {
    // 8 ranks, 10,000 reports each (about 2.8 hours of one-second reports).
    // Uniform ±10 % on every step, one step a report: the harshest case for a mean.
    let mut ctx = running("allreduce", 0, 8, 1000);
    let mut rng = Rng(7);
    let flagged = soak(
        &mut ctx,
        10_000,
        1,
        &mut || 0.1 * rng.symmetric(),
        |_, _| 1.0,
    );
    assert!(flagged.is_empty(), "false alarms: {flagged:?}");
    // Normal jitter (10 % standard deviation) on each of 10 steps a report.
    let mut ctx = running("allreduce", 0, 8, 1000);
    let mut rng = Rng(11);
    let flagged = soak(&mut ctx, 10_000, 10, &mut || 0.1 * rng.normal(), |_, _| 1.0);
    assert!(flagged.is_empty(), "false alarms: {flagged:?}");
    assert!(
        !ctx.events.iter().any(|e| e.text.contains("straggler")),
        "{:?}",
        ctx.events.last()
    );
}

#[test]
fn a_rank_slowed_one_and_a_half_times_is_flagged_within_three_reports() {
    let mut ctx = running("allreduce", 0, 8, 1000);
    let mut rng = Rng(3);
    // Worker 5 slows down during report 100: half of that report's steps are slow.
    let flagged = soak(
        &mut ctx,
        200,
        10,
        &mut || 0.1 * rng.symmetric(),
        |w, r| match (w, r) {
            (5, 100) => 1.25,
            (5, r) if r > 100 => 1.5,
            _ => 1.0,
        },
    );
    assert_eq!(flagged.keys().copied().collect::<Vec<_>>(), vec![5]);
    assert!(flagged[&5] <= 102, "flagged at report {}", flagged[&5]);
    let event = ctx
        .events
        .iter()
        .find(|e| e.text.starts_with("straggler: worker-5"))
        .expect("an event");
    assert!(event.text.contains("action: report"), "{}", event.text);
    assert!(event.text.contains("1.5"), "{}", event.text);
    // It is only reported: nothing restarted.
    assert!(ctx.roles.slots().all(|s| s.incarnation == 1));
}

#[test]
fn a_ps_straggler_is_replaced_alone_off_its_node() {
    let mut ctx = running("ps", 1, 3, 1000);
    ctx.spec.stability.straggler_action = StragglerAction::Replace;
    let mut effects = Vec::new();
    // Flagged, and replaced, at its second slow report.
    for r in 1..=2u64 {
        for w in 0..3 {
            let slow = if w == 2 { 2.0 } else { 1.0 };
            let m = MetricsRecord {
                global_step: r * 10,
                steps: 10,
                compute_seconds: 0.5 * slow,
                ..Default::default()
            };
            effects.extend(
                ctx.report_metrics(worker(w), 1, m, None, None, r * REPORT_MS)
                    .unwrap(),
            );
        }
    }
    assert!(
        effects.contains(&Effect::AvoidNodes(vec!["127.0.0.1".into()])),
        "{effects:?}"
    );
    assert!(effects.contains(&Effect::LaunchAgent {
        key: worker(2),
        incarnation: 2
    }));
    assert_eq!(ctx.roles.slot(worker(0)).unwrap().incarnation, 1);
    assert_eq!(ctx.roles.slot(worker(1)).unwrap().incarnation, 1);
    assert_eq!(ctx.generation, 0, "no group restart");
    assert!(ctx.stability.avoided.contains_key("127.0.0.1"));
}

#[test]
fn an_allreduce_straggler_is_replaced_after_a_checkpoint_at_the_cut() {
    let mut ctx = running("allreduce", 0, 2, 1000);
    ctx.spec.stability.straggler_action = StragglerAction::Replace;
    for r in 1..=2u64 {
        for w in 0..2 {
            let m = MetricsRecord {
                global_step: r * 10,
                steps: 10,
                compute_seconds: if w == 1 { 1.0 } else { 0.5 },
                ..Default::default()
            };
            ctx.report_metrics(worker(w), 1, m, None, None, r * REPORT_MS)
                .unwrap();
        }
    }
    assert_eq!(ctx.stability.replace_at_cut, Some(worker(1)));
    assert!(ctx.checkpoint_pending, "a cut is asked for first");
    let g = ctx.generation;
    let effects = ctx
        .checkpoint_committed(1, "/tmp/m".into(), 20, g, 3 * REPORT_MS)
        .unwrap();
    assert_eq!(ctx.generation, g + 1, "the group restarts from the cut");
    assert!(effects.contains(&Effect::StopAgent {
        key: worker(1),
        graceful: false
    }));
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::StopAgent { key, .. } if *key == worker(0))),
        "worker 0 keeps its agent: {effects:?}"
    );
    assert!(
        ctx.events
            .iter()
            .any(|e| e.text.contains("from checkpoint 1"))
    );
}

#[test]
fn an_allreduce_group_on_a_node_the_brain_cordons_moves_off_it_after_a_cut() {
    let mut ctx = running("allreduce", 0, 2, 1000);
    let node = ctx.roles.slot(worker(0)).unwrap().host.clone();
    assert!(ctx.nodes_cordoned(&["10.0.0.9".into()], 100).is_none());
    let effects = ctx.nodes_cordoned(std::slice::from_ref(&node), 100);
    assert!(effects.is_some());
    assert_eq!(ctx.stability.replace_at_cut, Some(worker(0)));
    assert!(ctx.checkpoint_pending, "a cut is asked for first");
    assert!(
        ctx.events.iter().any(|e| e.text
            == format!("worker-0 runs on {node}, which the brain cordoned: it moves off")),
        "{:#?}",
        ctx.events
    );
    // The brain says it again at every poll: one move at a time.
    assert!(
        ctx.nodes_cordoned(std::slice::from_ref(&node), 200)
            .is_none()
    );
    let g = ctx.generation;
    ctx.checkpoint_committed(1, "/tmp/m".into(), 20, g, 300)
        .unwrap();
    assert_eq!(ctx.generation, g + 1, "the group restarts from the cut");
    assert!(
        ctx.events.iter().any(|e| e
            .text
            .contains(&format!("worker-0 moved off cordoned node {node}"))),
        "{:#?}",
        ctx.events
    );
    assert_eq!(ctx.stability.moving_off, None);
    // Relaunched, nothing runs on the node until the platform places the new processes.
    assert!(
        ctx.nodes_cordoned(std::slice::from_ref(&node), 400)
            .is_none()
    );
}

#[test]
fn a_ps_worker_on_a_node_the_brain_cordons_moves_off_it_alone() {
    let mut ctx = running("ps", 1, 3, 1000);
    let node = ctx.roles.slot(worker(0)).unwrap().host.clone();
    let effects = ctx
        .nodes_cordoned(std::slice::from_ref(&node), 100)
        .unwrap();
    assert!(effects.contains(&Effect::LaunchAgent {
        key: worker(0),
        incarnation: 2
    }));
    assert_eq!(ctx.generation, 0, "no group restart");
    assert!(
        ctx.events.iter().any(|e| e.text
            == format!("moving worker-0 off cordoned node {node}: a new process off {node}")),
        "{:#?}",
        ctx.events
    );
    // It avoids nothing of its own: the brain's cordon keeps new processes off the node.
    assert!(ctx.stability.avoided.is_empty());
}

/// Every agent heartbeats at `now_ms` (they are alive; their processes may not be).
fn beat(ctx: &mut JobContext, now_ms: u64) {
    for w in 0..2 {
        let s = &ctx.roles.slot(worker(w)).unwrap();
        let (agent, inc) = (s.agent_id, s.incarnation);
        ctx.heartbeat(worker(w), agent, inc, None, 42, now_ms)
            .unwrap();
    }
}

/// Ticks at `now_ms` after the agents' heartbeats.
fn tick(ctx: &mut JobContext, now_ms: u64) {
    beat(ctx, now_ms);
    ctx.tick(now_ms);
}

/// Two workers step once a second for five seconds, then fall silent.
fn silent_group() -> JobContext {
    let mut ctx = running("allreduce", 0, 2, 1000);
    ctx.spec.stability.hang_min_s = 3.0;
    ctx.spec.stability.hang_after_steps = 3.0;
    lease(&mut ctx, worker(0), 1).unwrap();
    for r in 1..=5u64 {
        for w in 0..2 {
            let m = MetricsRecord {
                global_step: r,
                steps: 1,
                compute_seconds: 0.5,
                ..Default::default()
            };
            ctx.report_metrics(worker(w), 1, m, None, None, r * REPORT_MS)
                .unwrap();
        }
    }
    ctx
}

use super::tests::lease;

#[test]
fn a_silent_group_is_hung_its_stacks_are_captured_then_it_restarts() {
    let mut ctx = silent_group();
    tick(&mut ctx, 7_000);
    assert!(
        ctx.stability.capturing.is_none(),
        "2 s of silence is not a hang"
    );
    tick(&mut ctx, 8_100);
    let c = ctx.stability.capturing.clone().expect("a hang");
    assert_eq!(c.awaiting.len(), 2, "every rank's stacks");
    assert!(ctx.stacks_wanted(worker(0), 1) && ctx.stacks_wanted(worker(1), 1));
    assert!(
        ctx.stacks_reported(worker(0), 1, "process 1 (x) is sleeping\n".into(), 8_300)
            .is_empty()
    );
    assert_eq!(ctx.generation, 0, "waits for the other's stacks");
    ctx.stacks_reported(
        worker(1),
        1,
        "process 2 (x) is stopped (SIGSTOP)\n".into(),
        8_400,
    );
    assert_eq!(ctx.generation, 1, "the group restarted");
    assert!(ctx.stability.capturing.is_none());
    let h = ctx.stability.hangs.last().unwrap();
    assert!(h.why.contains("reported no step for"), "{}", h.why);
    assert_eq!(h.stacks.len(), 2);
    assert!(h.stacks["worker-1"].contains("SIGSTOP"));
    assert!(ctx.events.iter().any(|e| e.text.contains("failed (hung:")));
    assert_eq!(
        ctx.roles.restarts()[&Role::WORKER],
        1,
        "a hang counts as a failure"
    );
}

#[test]
fn a_hang_restarts_without_the_stacks_that_do_not_come() {
    let mut ctx = silent_group();
    tick(&mut ctx, 8_100);
    ctx.stacks_reported(worker(0), 1, "x".into(), 8_200);
    tick(&mut ctx, 8_100 + CAPTURE_WAIT_MS / 2);
    assert_eq!(ctx.generation, 0, "{:#?}", ctx.events);
    tick(&mut ctx, 8_200 + CAPTURE_WAIT_MS);
    assert_eq!(ctx.generation, 1);
    assert!(
        ctx.events
            .iter()
            .any(|e| e.text.starts_with("no stacks from worker-1"))
    );
    // The new incarnations are not hung: they have made no step yet.
    tick(&mut ctx, 60_000);
    assert!(ctx.stability.capturing.is_none());
}

#[test]
fn a_transition_holds_the_hang_clock() {
    let mut ctx = silent_group();
    // As if a plan held the group still until 7.5 s.
    ctx.stability.quiet_until_ms = 7_500;
    tick(&mut ctx, 9_000);
    assert!(ctx.stability.capturing.is_none());
    tick(&mut ctx, 10_600);
    assert!(ctx.stability.capturing.is_some());
}

#[test]
fn a_straggler_found_while_the_group_is_busy_is_replaced_once_it_is_not() {
    let mut ctx = running("ps", 1, 3, 1000);
    ctx.spec.stability.straggler_action = StragglerAction::Replace;
    // A replacement already waits for its cut: the new straggler waits its turn.
    ctx.stability.replace_at_cut = Some(worker(0));
    let report = |ctx: &mut JobContext, r: u64| {
        let mut effects = Vec::new();
        for w in 0..3 {
            let m = MetricsRecord {
                global_step: r * 10,
                steps: 10,
                compute_seconds: if w == 2 { 1.0 } else { 0.5 },
                ..Default::default()
            };
            let inc = ctx.roles.slot(worker(w)).unwrap().incarnation;
            effects.extend(
                ctx.report_metrics(worker(w), inc, m, None, None, r * REPORT_MS)
                    .unwrap(),
            );
        }
        effects
    };
    report(&mut ctx, 1);
    let effects = report(&mut ctx, 2);
    assert!(effects.is_empty(), "{effects:?}");
    assert!(
        ctx.events
            .iter()
            .any(|e| e.text.contains("worker-2 is not replaced now"))
    );
    ctx.stability.replace_at_cut = None;
    let effects = report(&mut ctx, 3);
    assert!(
        effects.contains(&Effect::LaunchAgent {
            key: worker(2),
            incarnation: 2
        }),
        "{effects:?}"
    );
}

/// Two reports in which worker `slow` computes twice as long as the others; the effects.
fn slow_reports(ctx: &mut JobContext, slow: u32) -> Vec<Effect> {
    let workers: Vec<u32> = ctx
        .roles
        .slots()
        .map(|s| s.key)
        .filter(|k| k.role == Role::WORKER)
        .map(|k| k.index)
        .collect();
    let mut effects = Vec::new();
    for r in 1..=2u64 {
        for &w in &workers {
            let m = MetricsRecord {
                global_step: r * 10,
                steps: 10,
                compute_seconds: if w == slow { 1.0 } else { 0.5 },
                ..Default::default()
            };
            effects.extend(
                ctx.report_metrics(worker(w), 1, m, None, None, r * REPORT_MS)
                    .unwrap(),
            );
        }
    }
    effects
}

/// A job of `workers` workers, `min` of them at least, that shrinks its stragglers out.
fn shrinking(kind: &str, ps: u32, workers: u32, min: i64) -> JobContext {
    let mut ctx = running(kind, ps, workers, 1000);
    ctx.spec.roles.get_mut(&Role::WORKER).unwrap().min = Some(min);
    ctx.spec.stability.straggler_action = StragglerAction::Shrink;
    ctx
}

fn stopped(effects: &[Effect], w: u32, how: bool) -> bool {
    effects.contains(&Effect::StopAgent {
        key: worker(w),
        graceful: how,
    })
}

fn has_event(ctx: &JobContext, text: &str) -> bool {
    ctx.events.iter().any(|e| e.text.contains(text))
}

#[test]
fn a_ps_straggler_that_is_not_the_last_shrinks_the_group_by_its_last_index() {
    let mut ctx = shrinking("ps", 1, 3, 2);
    for w in 0..3 {
        super::tests::lease(&mut ctx, worker(w), 1).expect("a shard");
    }
    let effects = slow_reports(&mut ctx, 1);
    assert!(effects.contains(&Effect::AvoidNodes(vec!["127.0.0.1".into()])));
    // worker-2 leaves (gracefully); worker-1 gets a new process off the node.
    assert!(stopped(&effects, 2, true), "{effects:?}");
    assert!(effects.contains(&Effect::LaunchAgent {
        key: worker(1),
        incarnation: 2
    }));
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::LaunchAgent { key, .. } if *key == worker(2)))
    );
    assert_eq!(ctx.role_counts()[&Role::WORKER], 2);
    assert_eq!(ctx.roles.slot(worker(2)).unwrap().phase, SlotPhase::Removed);
    assert_eq!(ctx.generation, 0, "no group restart");
    assert!(has_event(&ctx, "action: shrink"));
    assert!(has_event(
        &ctx,
        "shrinking straggler worker-1 out (worker-1 gets a new process, worker-2 leaves)"
    ));
    // The shards the two held go back to the queue, to be trained once by someone else.
    assert_eq!(ctx.ledger.in_flight(), 1, "worker-0's only");
}

#[test]
fn a_ps_straggler_that_is_the_last_index_simply_leaves() {
    let mut ctx = shrinking("ps", 1, 3, 1);
    let effects = slow_reports(&mut ctx, 2);
    assert!(stopped(&effects, 2, true), "{effects:?}");
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::LaunchAgent { .. })),
        "{effects:?}"
    );
    assert_eq!(ctx.role_counts()[&Role::WORKER], 2);
    assert!(
        !ctx.stability.stragglers.contains_key(&worker(2)),
        "its flag leaves with it"
    );
    assert!(ctx.stability.avoided.contains_key("127.0.0.1"));
    assert!(has_event(
        &ctx,
        "straggler worker-2 shrunk out: the worker group goes on with 2; its process stops"
    ));
}

/// A checkpoint's drain waiting on the straggler's lease goes ahead once the straggler leaves
/// (seen stalling a job for good when the shrink came during a drain), and once it moves.
#[test]
fn a_ps_straggler_leaving_or_moving_during_a_drain_lets_the_checkpoint_go_ahead() {
    for (workers, slow) in [(3, 2), (3, 1)] {
        let mut ctx = shrinking("ps", 1, workers, 1);
        super::tests::lease(&mut ctx, worker(slow), 1).expect("a shard");
        ctx.checkpoint_pending = true;
        assert_eq!(ctx.ledger.in_flight(), 1);
        let effects = slow_reports(&mut ctx, slow);
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::SavePsCheckpoint { .. })),
            "worker-{slow} of {workers}: {effects:?}"
        );
        assert!(ctx.checkpoint_saving);
    }
}

#[test]
fn an_allreduce_group_shrinks_at_a_cut_and_restarts_one_smaller() {
    let mut ctx = shrinking("allreduce", 0, 3, 2);
    let effects = slow_reports(&mut ctx, 0);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::StopAgent { .. })),
        "a cut first: {effects:?}"
    );
    assert_eq!(ctx.stability.replace_at_cut, Some(worker(0)));
    assert!(ctx.checkpoint_pending);
    let g = ctx.generation;
    let effects = ctx
        .checkpoint_committed(1, "/tmp/m".into(), 20, g, 3 * REPORT_MS)
        .unwrap();
    assert_eq!(ctx.generation, g + 1, "the group restarts from the cut");
    assert!(stopped(&effects, 2, true), "{effects:?}");
    assert!(
        stopped(&effects, 0, false),
        "worker-0 moves to a new agent: {effects:?}"
    );
    assert!(!stopped(&effects, 1, false) && !stopped(&effects, 1, true));
    assert_eq!(ctx.role_counts()[&Role::WORKER], 2);
    assert_eq!(ctx.group.rendezvous().unwrap().expected, 2);
    assert!(!ctx.stability.shrinking);
    assert!(has_event(
        &ctx,
        "straggler worker-0 shrunk out: the worker group goes on with 2: every process restarts from checkpoint 1"
    ));
}

#[test]
fn a_group_at_its_min_replaces_its_straggler_instead() {
    let mut ctx = shrinking("ps", 1, 2, 2);
    let effects = slow_reports(&mut ctx, 0);
    assert!(has_event(
        &ctx,
        "worker-0 is replaced, not shrunk out: its group has 2 worker(s), its min is 2"
    ));
    assert!(effects.contains(&Effect::LaunchAgent {
        key: worker(0),
        incarnation: 2
    }));
    assert!(!stopped(&effects, 1, true));
    assert_eq!(ctx.role_counts()[&Role::WORKER], 2);
}

#[test]
fn a_cut_that_fails_leaves_the_group_whole() {
    let mut ctx = shrinking("allreduce", 0, 3, 2);
    slow_reports(&mut ctx, 1);
    assert!(ctx.stability.shrinking);
    let g = ctx.generation;
    ctx.checkpoint_failed(g, "disk full".into(), 3 * REPORT_MS);
    assert!(!ctx.stability.shrinking && ctx.stability.replace_at_cut.is_none());
    assert_eq!(ctx.role_counts()[&Role::WORKER], 3);
    assert!(has_event(
        &ctx,
        "straggler worker-1 is not shrunk out: no checkpoint to restart from"
    ));
}
