//! Replays with faults at set times, figure by figure: what a crash, a hang and a slowdown cost
//! a job when they are detected and when they are waited out.

use super::engine::{FaultHandling, FaultKind, Handling, ScriptedFault};
use super::{ClusterSpec, JobRecord, SimConfig, TraceJob, Work, simulate};
use crate::schedule::Fifo;

/// A 600 s job on both GPUs of two one-GPU nodes, submitted at 0: placed at 0, its restart
/// penalty until 30, then 90 s of its work done by 120, when `kind` strikes node 1.
fn replay(kind: FaultKind, handling: Handling) -> JobRecord {
    let trace = [TraceJob {
        name: "a".into(),
        submit_s: 0.0,
        requested_replicas: 2,
        work: Work::Rigid {
            duration_s: 600.0,
            label: "x".into(),
        },
    }];
    let config = SimConfig {
        faults: vec![ScriptedFault {
            at_s: 120.0,
            node: 1,
            kind,
        }],
        fault_handling: FaultHandling {
            handling,
            ..FaultHandling::default()
        },
        ..SimConfig::default()
    };
    let cluster = ClusterSpec::uniform(2, 1, "t4");
    let r = simulate(&trace, &[], &cluster, &Fifo::default(), &config, &mut ()).unwrap();
    let j = r.jobs[0].clone();
    // Whatever happened, it trained 600 s in all.
    assert!((j.training_s - 600.0).abs() < 1e-6, "{j:?}");
    let share = 600.0 / (j.finish_s.unwrap() - j.start_s.unwrap());
    assert!((j.effective_training().unwrap() - share).abs() < 1e-9);
    assert!((r.summary.effective_training - share).abs() < 1e-9);
    j
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn a_crash_is_noticed_at_the_heartbeat_timeout_and_the_job_restarts_when_the_node_is_back() {
    let j = replay(
        FaultKind::Crash { down_s: 60.0 },
        Handling::DetectAndIsolate,
    );
    // Stalled 10 s on node 0's GPU; node 1 back at 180; restarted there, 30 s penalty, the
    // 510 s left: done at 720.
    assert!(close(j.finish_s.unwrap(), 720.0), "{j:?}");
    assert!(close(j.stalled_gpu_seconds, 10.0), "{j:?}");
    assert_eq!((j.faults, j.restarts), (1, 1));
    assert!(close(j.gpu_seconds, 240.0 + 10.0 + 2.0 * 540.0), "{j:?}");
}

#[test]
fn a_hang_costs_the_step_clock_when_detected_and_the_collective_timeout_when_not() {
    let detected = replay(FaultKind::Hang { down_s: 60.0 }, Handling::DetectAndIsolate);
    // Found 125 s after 120: GPUs back at 245, placed at the round of 300, done at 840.
    assert!(close(detected.finish_s.unwrap(), 840.0), "{detected:?}");
    assert!(close(detected.stalled_gpu_seconds, 125.0), "{detected:?}");
    let waited = replay(FaultKind::Hang { down_s: 60.0 }, Handling::WaitForCrash);
    // NCCL's 30 minutes: back at 1920 (a round boundary), done at 2460.
    assert!(close(waited.finish_s.unwrap(), 2460.0), "{waited:?}");
    assert!(close(waited.stalled_gpu_seconds, 1800.0), "{waited:?}");
    assert_eq!((waited.faults, waited.restarts), (1, 1));
}

#[test]
fn a_slow_node_is_isolated_when_detected_and_slows_the_job_when_not() {
    let slow = FaultKind::Slow {
        factor: 0.5,
        duration_s: 600.0,
    };
    let detected = replay(slow.clone(), Handling::DetectAndIsolate);
    // Half speed from 120 to the round of 180 (30 s of work), where node 1 is found slow and
    // isolated; the job needs both GPUs, so it waits for node 1 to be well at 720: 30 s
    // penalty, the 480 s left, done at 1230.
    assert!(close(detected.finish_s.unwrap(), 1230.0), "{detected:?}");
    assert_eq!((detected.faults, detected.restarts), (1, 1));
    assert_eq!(detected.stalled_gpu_seconds, 0.0);
    let waited = replay(slow, Handling::WaitForCrash);
    // Half speed from 120 to 720 (300 s of work), then the 210 s left: done at 930, never
    // moved.
    assert!(close(waited.finish_s.unwrap(), 930.0), "{waited:?}");
    assert_eq!((waited.faults, waited.restarts), (0, 0));
}
