//! The analysis notebook (`notebooks/whatif.ipynb`) executed headless on a small replay's
//! Parquet tables, as a user would run it: `brainctl whatif --out DIR`, then nbconvert; and on
//! the tables a replay row by row (`--stream`) writes as it goes.
//!
//! It needs a Python with the packages of `notebooks/requirements.txt`: `BRAIN_PYTHON` names
//! it (`.ci/run` creates a virtualenv and sets it, with `BRAIN_REQUIRE_NOTEBOOK=1` so a missing
//! Python fails the run); without either, the test says why it did not run.

use std::path::Path;
use std::process::Command;

#[test]
fn the_notebook_runs_on_a_small_replay_whole_or_streamed() {
    let python = std::env::var("BRAIN_PYTHON").unwrap_or_else(|_| "python3".into());
    let ready = Command::new(&python)
        .args(["-c", "import polars, matplotlib, nbconvert, ipykernel"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        test_support::optional_server(
            "BRAIN_REQUIRE_NOTEBOOK",
            &format!("a Python with notebooks/requirements.txt ({python} lacks them)"),
            "set BRAIN_PYTHON to one, as .ci/run does with its virtualenv",
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let data = datasets::bundled().join("pollux");
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(data.join("workloads/workload-1.csv")).unwrap();
    let trace = dir.path().join("small.csv");
    let lines: Vec<&str> = text.lines().take(25).collect();
    std::fs::write(&trace, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("out");
    let profiles = data.join("traces");
    whatif(
        &root,
        &[
            "--trace".as_ref(),
            trace.as_os_str(),
            "--profiles".as_ref(),
            profiles.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
            "--offline-slot-s".as_ref(),
            "600".as_ref(),
        ],
        &["fifo", "pollux", "elastic_lp"],
    );
    let text = execute(&python, &root, &out, "fifo, pollux, elastic_lp");
    // The bound's table read, checked against the summary, drawn; the offline plan beside it.
    assert!(
        text.contains("no policy beats the bound"),
        "the bound was not checked"
    );
    assert!(
        text.contains("offline plan: mean JCT"),
        "the offline plan was not read"
    );
    let png = std::fs::read(out.join("notebook_bound.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    // Where the distance goes: each account checked to add up, and drawn.
    assert!(
        text.contains("every account adds up"),
        "the account was not checked"
    );
    let png = std::fs::read(out.join("notebook_account.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"));

    // A Philly job list replayed row by row: the same notebook reads its tables.
    let text = std::fs::read_to_string(data.join("traces/philly-sample.csv")).unwrap();
    let mut lines: Vec<&str> = text.lines().take(301).collect();
    let header = lines.remove(0);
    lines.sort_by_key(|l| l.split(',').next().unwrap_or_default().to_string());
    let list = dir.path().join("list.csv");
    std::fs::write(&list, format!("{header}\n{}\n", lines.join("\n"))).unwrap();
    let streamed = dir.path().join("streamed");
    whatif(
        &root,
        &[
            "--trace".as_ref(),
            list.as_os_str(),
            "--cluster".as_ref(),
            "8x8:p100".as_ref(),
            "--round-s".as_ref(),
            "360".as_ref(),
            "--stream".as_ref(),
            "--out".as_ref(),
            streamed.as_os_str(),
        ],
        &["fifo", "elastic_lp"],
    );
    let text = execute(&python, &root, &streamed, "fifo, elastic_lp");
    assert!(
        text.contains("no bound table"),
        "a streamed replay writes no bound"
    );
}

/// Runs `brainctl whatif` with `args` under the example `policies`; it must succeed.
fn whatif(root: &Path, args: &[&std::ffi::OsStr], policies: &[&str]) {
    let mut run = Command::new(env!("CARGO_BIN_EXE_brainctl"));
    run.arg("whatif").args(args);
    for p in policies {
        run.arg("--policy")
            .arg(root.join(format!("examples/policies/{p}.toml")));
    }
    let run = run.output().unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Runs the notebook on the tables in `out`; its consistency cell must pass for `policies`
/// and its charts be written. Returns the executed notebook's text.
fn execute(python: &str, root: &Path, out: &Path, policies: &str) -> String {
    let executed = out.join("executed.ipynb");
    let nb = Command::new(python)
        .args([
            "-m",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--output",
        ])
        .arg(&executed)
        .arg(root.join("notebooks/whatif.ipynb"))
        .env("WHATIF_OUT", out)
        .output()
        .unwrap();
    assert!(
        nb.status.success(),
        "{}",
        String::from_utf8_lossy(&nb.stderr)
    );
    let text = std::fs::read_to_string(&executed).unwrap();
    assert!(
        text.contains(&format!("tables consistent for {policies}")),
        "the notebook's consistency cell did not pass"
    );
    for chart in ["notebook_jct_cdf.png", "notebook_utilisation.png"] {
        let png = std::fs::read(out.join(chart)).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{chart}");
    }
    text
}
