//! Fuzzing every trace parser on stable Rust (proptest): the start of each bundled file, mangled
//! by random edits (characters inserted, deleted and replaced, lines cut short, whole random
//! text), is written to a file and read. A parser may accept it or refuse it, never panic, and a
//! refusal names the file. CI runs 64 cases per parser; the long run is
//! `PROPTEST_CASES=100000 cargo test -p datasets --test fuzz_parsers --release`.

use std::path::{Path, PathBuf};

use datasets::DatasetError;
use proptest::prelude::*;
use test_support::fuzz::input;

/// The first `lines` lines of a bundled file.
fn seed(rel: &str, lines: usize) -> String {
    let path = datasets::bundled().join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().take(lines).collect::<Vec<_>>().join("\n") + "\n"
}

/// Writes `text` as `name` in a fresh directory and reads it with `read`: no panic, and an
/// error names the file.
fn check<T>(name: &str, text: &str, read: impl Fn(&Path) -> Result<T, DatasetError>) {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    if let Err(e) = read(&path) {
        let said = e.to_string();
        assert!(
            said.contains(name),
            "an error that does not name the file: {said}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(test_support::fuzz::cases(64)))]

    #[test]
    fn gavel_traces(text in input(seed("gavel/traces_msr_seed0/11cb48.trace", 20))) {
        check("t.trace", &text, datasets::gavel::read_trace);
    }

    #[test]
    fn pollux_workloads(text in input(seed("pollux/workloads/workload-1.csv", 20))) {
        check("w.csv", &text, datasets::pollux::read_workload);
    }

    #[test]
    fn philly_job_lists(text in input(philly_seed())) {
        check("philly.csv", &text, datasets::philly::read_jobs);
    }

    #[test]
    fn alibaba_pods(text in input(seed("alibaba_gpu_v2023/openb_pod_list_default.csv", 20))) {
        check("pods.csv", &text, datasets::alibaba::read_pods);
    }

    #[test]
    fn alibaba_nodes(text in input(seed("alibaba_gpu_v2023/openb_node_list_gpu_node.csv", 20))) {
        check("nodes.csv", &text, datasets::alibaba::read_nodes);
    }

    #[test]
    fn alibaba_dlrm(text in input(seed("alibaba_gpu_v2025/disaggregated_DLRM_trace.csv", 20))) {
        check("dlrm.csv", &text, datasets::alibaba::read_dlrm);
    }
}

/// A Philly job list in the shape `traces/philly.csv` has (the file itself is not bundled).
fn philly_seed() -> String {
    "timestamp,duration,num_gpus,gpu_time,cluster\n\
     2017-10-03 04:12:45,3600,1,3600,vc1\n2017-10-03 04:13:45,7200,4,28800,vc2\n\
     2017-10-03 05:00:00,600,8,4800,vc1\n"
        .to_string()
}

/// The seeds themselves read: the edits start from valid input, not only from errors.
#[test]
fn the_seeds_read() {
    let ok = |name: &str, text: String, read: &dyn Fn(&Path) -> Result<usize, DatasetError>| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let n = read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(n > 0, "{name}: nothing read");
    };
    ok(
        "t.trace",
        seed("gavel/traces_msr_seed0/11cb48.trace", 20),
        &|p| datasets::gavel::read_trace(p).map(|v| v.len()),
    );
    ok("w.csv", seed("pollux/workloads/workload-1.csv", 20), &|p| {
        datasets::pollux::read_workload(p).map(|v| v.len())
    });
    ok("philly.csv", philly_seed(), &|p| {
        datasets::philly::read_jobs(p).map(|v| v.len())
    });
    ok(
        "pods.csv",
        seed("alibaba_gpu_v2023/openb_pod_list_default.csv", 20),
        &|p| datasets::alibaba::read_pods(p).map(|v| v.len()),
    );
    ok(
        "nodes.csv",
        seed("alibaba_gpu_v2023/openb_node_list_gpu_node.csv", 20),
        &|p| datasets::alibaba::read_nodes(p).map(|v| v.len()),
    );
    ok(
        "dlrm.csv",
        seed("alibaba_gpu_v2025/disaggregated_DLRM_trace.csv", 20),
        &|p| datasets::alibaba::read_dlrm(p).map(|v| v.len()),
    );
}
