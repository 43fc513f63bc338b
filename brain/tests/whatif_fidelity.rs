//! Fidelity: on Pollux's eight workloads (64 T4 GPUs as 16 × 4, 60 s rounds, 30 s restarts) our
//! Pollux, Optimus and Tiresias land within 10 % of the mean JCTs Pollux's artifact published
//! (`pollux/results-jobload/<policy>-1.0/summary.json`), and ours beats the best published
//! results on Pollux's and Sia's workloads.

use std::path::PathBuf;

use brain::whatif::{NamedPolicy, Options, TraceFormat, load_traces, run};
use optimizer::schedule::{ElasticLp, Optimus, Pollux, SchedulerKind, Tiresias};
use optimizer::sim::{ClusterSpec, SimConfig};

fn data() -> PathBuf {
    datasets::bundled().join("pollux")
}

fn published(policy: &str) -> f64 {
    let path = data().join(format!("results-jobload/{policy}-1.0/summary.json"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["mean"].as_f64().unwrap()
}

#[test]
fn pollux_optimus_and_tiresias_match_their_published_mean_jcts() {
    let traces = load_traces(&[data().join("workloads")], TraceFormat::Workload).unwrap();
    assert_eq!(traces.len(), 8);
    let profiles = datasets::pollux::read_apps(&data().join("traces")).unwrap();
    let policies = vec![
        NamedPolicy {
            label: "pollux".into(),
            scheduler: SchedulerKind::Pollux(Pollux::default()),
            live_round: None,
            handling: None,
        },
        NamedPolicy {
            label: "optimus".into(),
            scheduler: SchedulerKind::Optimus(Optimus::default()),
            live_round: None,
            handling: None,
        },
        NamedPolicy {
            label: "tiresias".into(),
            scheduler: SchedulerKind::Tiresias(Tiresias::default()),
            live_round: None,
            handling: None,
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

/// Ours (`elastic_lp`, the defaults of examples/policies/elastic_lp.toml) against the best
/// published results: Pollux's 2,751 s mean JCT on Pollux's workloads, and Sia's 0.7 h on
/// Sia's Helios "saturn" workloads (Sia's default simulated cluster: 6 × 4 T4, 2 × 8 A100,
/// 3 × 8 RTX 2080 Ti).
#[test]
fn ours_beats_pollux_on_its_workloads_and_sia_on_saturn() {
    let ours = vec![NamedPolicy {
        label: "elastic_lp".into(),
        scheduler: SchedulerKind::ElasticLp(ElasticLp::default()),
        live_round: None,
        handling: None,
    }];
    let options = |cluster: &str| Options {
        cluster: ClusterSpec::parse(cluster).unwrap(),
        sim: SimConfig::default(),
        parallel: 2,
    };
    let pollux = load_traces(&[data().join("workloads")], TraceFormat::Workload).unwrap();
    let profiles = datasets::pollux::read_apps(&data().join("traces")).unwrap();
    let r = run(&pollux, &profiles, &ours, &options("16x4:t4"), &|_| {}).unwrap();
    let mean = r[0].summary.mean_jct_s;
    println!("Pollux workloads: elastic_lp {mean:.0} s (Pollux published 2,751 s)");
    assert_eq!(r[0].summary.finished, 8 * 160);
    assert!(mean <= published("pollux"), "{mean:.0} s");

    let sia = data().join("../sia");
    let saturn = load_traces(&[sia.join("workloads/saturn")], TraceFormat::Workload).unwrap();
    assert_eq!(saturn.len(), 10);
    let apps = brain::whatif::applications(&saturn);
    let profiles = datasets::pollux::read_apps_named(&sia.join("traces"), &apps).unwrap();
    let r = run(
        &saturn,
        &profiles,
        &ours,
        &options("6x4:aws,2x8:dgx-ext,3x8:rtx"),
        &|_| {},
    )
    .unwrap();
    let hours = r[0].summary.mean_jct_s / 3600.0;
    println!("Sia saturn: elastic_lp {hours:.2} h (Sia published 0.7 h)");
    assert_eq!(r[0].summary.finished, 1600);
    assert!(hours <= 0.7, "{hours:.2} h");
}
