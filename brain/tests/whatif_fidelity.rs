//! Fidelity: on Pollux's eight workloads (64 T4 GPUs as 16 × 4, 60 s rounds, 30 s restarts) our
//! Pollux, Optimus and Tiresias land within 10 % of the mean JCTs Pollux's artifact published
//! (`pollux/results-jobload/<policy>-1.0/summary.json`).

use std::path::{Path, PathBuf};

use brain::whatif::{NamedPolicy, Options, load_traces, run};
use optimizer::schedule::{Optimus, Pollux, SchedulerKind, Tiresias};
use optimizer::sim::{ClusterSpec, SimConfig};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/pollux")
}

fn published(policy: &str) -> f64 {
    let path = data().join(format!("results-jobload/{policy}-1.0/summary.json"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["mean"].as_f64().unwrap()
}

#[test]
fn pollux_optimus_and_tiresias_match_their_published_mean_jcts() {
    let traces = load_traces(&[data().join("workloads")]).unwrap();
    assert_eq!(traces.len(), 8);
    let profiles = datasets::pollux::read_apps(&data().join("traces")).unwrap();
    let policies = vec![
        NamedPolicy {
            label: "pollux".into(),
            scheduler: SchedulerKind::Pollux(Pollux::default()),
        },
        NamedPolicy {
            label: "optimus".into(),
            scheduler: SchedulerKind::Optimus(Optimus::default()),
        },
        NamedPolicy {
            label: "tiresias".into(),
            scheduler: SchedulerKind::Tiresias(Tiresias::default()),
        },
    ];
    let options = Options {
        cluster: ClusterSpec::uniform(16, 4, "t4"),
        sim: SimConfig::default(),
        parallel: 2,
    };
    let results = run(&traces, &profiles, &policies, &options, &|_| {}).unwrap();
    let mut failures = Vec::new();
    for r in &results {
        let ours = r.summary.mean_jct_s;
        let theirs = published(&r.label);
        let error = (ours - theirs) / theirs;
        let per: Vec<String> = r
            .runs
            .iter()
            .map(|(t, rep)| format!("{t}: {:.0}", rep.summary.mean_jct_s))
            .collect();
        println!(
            "{}: {ours:.0} s against {theirs:.0} s published ({:+.1} %); {}",
            r.label,
            100.0 * error,
            per.join(", ")
        );
        assert_eq!(
            r.summary.finished,
            8 * 160,
            "{}: every job finishes",
            r.label
        );
        if error.abs() > 0.10 {
            failures.push(format!("{}: {ours:.0} vs {theirs:.0}", r.label));
        }
    }
    assert!(failures.is_empty(), "beyond 10 %: {failures:?}");
}
