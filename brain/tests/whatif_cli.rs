//! `brainctl whatif` as a user runs it: a real process on a small replay whose report is a
//! golden file (any change in results is a visible diff; `UPDATE_GOLDEN=1` rewrites it), the
//! files it writes, and clear errors for bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

fn pollux() -> PathBuf {
    datasets::bundled().join("pollux")
}

fn policy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/policies/{name}.toml"))
}

/// Every example policy file: the side-by-side comparison the issue asks for.
const POLICIES: [&str; 8] = [
    "fifo",
    "dlrover",
    "optimus",
    "gavel_max_throughput",
    "gavel_max_min_fairness",
    "pollux",
    "tiresias",
    "elastic_lp",
];

fn brainctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_brainctl"))
        .args(args)
        .output()
        .unwrap()
}

/// The table a successful `brainctl whatif` printed.
fn table_of(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The cells of `policy`'s row of a table.
fn row<'a>(table: &'a str, policy: &str) -> Vec<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(policy))
        .unwrap_or_else(|| panic!("no row {policy} in {table}"))
        .split_whitespace()
        .collect()
}

/// A table the CLI wrote as CSV (no quoted commas in it): its header and its rows' cells.
struct Csv<'a> {
    header: Vec<&'a str>,
    rows: Vec<Vec<&'a str>>,
}

impl<'a> Csv<'a> {
    fn parse(text: &'a str) -> Self {
        let mut lines = text.lines().map(|l| l.split(',').collect::<Vec<_>>());
        let header = lines.next().expect("a header");
        Csv {
            header,
            rows: lines.collect(),
        }
    }

    /// The index of the column named `name`.
    fn col(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.header))
    }
}

/// The first `n` jobs of Pollux's workload 1.
fn small_trace(dir: &Path, n: usize) -> PathBuf {
    let text = std::fs::read_to_string(pollux().join("workloads/workload-1.csv")).unwrap();
    let lines: Vec<&str> = text.lines().take(n + 1).collect();
    let path = dir.join("small.csv");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn a_small_replay_reports_what_the_golden_file_says_and_writes_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 24);
    let out = dir.path().join("out");
    let profiles = pollux().join("traces");
    let mut args = vec![
        "whatif".to_string(),
        "--trace".into(),
        trace.display().to_string(),
        "--profiles".into(),
        profiles.display().to_string(),
        "--cluster".into(),
        "8x4:t4".into(),
        "--seed".into(),
        "7".into(),
        "--node-mtbf-s".into(),
        "50000".into(),
        "--node-repair-s".into(),
        "1800".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    for p in POLICIES {
        args.push("--policy".into());
        args.push(policy(p).display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = brainctl(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let report = String::from_utf8(run.stdout).unwrap();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/whatif_small.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &report).unwrap();
    }
    let expected = std::fs::read_to_string(&golden).unwrap();
    assert_eq!(
        report, expected,
        "the report changed; if on purpose, rerun with UPDATE_GOLDEN=1"
    );
    assert!(
        stderr.contains("slowest scheduling round: fifo"),
        "{stderr}"
    );
    // The same seed gives the same report; node failures make the seed matter.
    let again = brainctl(&args);
    assert_eq!(String::from_utf8(again.stdout).unwrap(), expected);
    for stem in ["jobs", "rounds", "summary", "bound", "account"] {
        for ext in ["parquet", "csv"] {
            let f = out.join(format!("{stem}.{ext}"));
            assert!(
                std::fs::metadata(&f).map(|m| m.len() > 0).unwrap_or(false),
                "{}",
                f.display()
            );
        }
    }
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    assert!(
        jobs.starts_with("policy,trace,job,application,submit_s,start_s,finish_s,jct_s,"),
        "{jobs}"
    );
    assert_eq!(jobs.lines().count(), 1 + POLICIES.len() * 24);
    // Each job's GPU-seconds spent (re)starting: some (every job started), within what it held.
    let csv = Csv::parse(&jobs);
    let (held, restarting) = (csv.col("gpu_seconds"), csv.col("restart_gpu_seconds"));
    for cells in &csv.rows {
        let (h, r): (f64, f64) = (
            cells[held].parse().unwrap(),
            cells[restarting].parse().unwrap(),
        );
        assert!(r > 0.0 && r < h, "{cells:?}");
    }
    // Each finished job's time in parts, which add up to its JCT.
    let parts = optimizer::sim::JctAccount::NAMES;
    for cells in &csv.rows {
        let jct: f64 = cells[csv.col("jct_s")].parse().unwrap();
        let sum: f64 = parts
            .iter()
            .map(|c| cells[csv.col(c)].parse::<f64>().unwrap())
            .sum();
        assert!((sum - jct).abs() < 1e-6 * jct, "{cells:?}");
    }
    // The bound's row first, then each policy's figures over it: none below 1.
    let bound_csv = std::fs::read_to_string(out.join("bound.csv")).unwrap();
    let bound = Csv::parse(&bound_csv);
    assert_eq!(bound.rows.len(), 1 + POLICIES.len());
    assert_eq!(bound.rows[0][bound.col("policy")], "lower bound");
    for c in [
        "mean_jct_over_bound",
        "p99_jct_over_bound",
        "makespan_over_bound",
    ] {
        for row in &bound.rows {
            let v: f64 = row[bound.col(c)].parse().unwrap();
            assert!(v >= 1.0, "{c} {row:?}");
        }
    }
    // Where each policy's distance to the bound goes: its parts, less what the bound adds
    // above the jobs' alone bounds, are its mean JCT over the bound's, in seconds.
    let account_csv = std::fs::read_to_string(out.join("account.csv")).unwrap();
    let account = Csv::parse(&account_csv);
    assert_eq!(account.rows.len(), POLICIES.len());
    let bound_mean: f64 = bound.rows[0][bound.col("mean_jct_s")].parse().unwrap();
    for (row, figures) in account.rows.iter().zip(&bound.rows[1..]) {
        let get = |c: &str| -> f64 { row[account.col(c)].parse().unwrap() };
        // Beyond the alone bound: every part but the first two (`floor_s`, `least_s`).
        let parts: f64 = parts[2..].iter().map(|c| get(c)).sum();
        let over = get("over_bound_s");
        let mean: f64 = figures[bound.col("mean_jct_s")].parse().unwrap();
        assert!((over - (mean - bound_mean)).abs() < 1e-6 * mean, "{row:?}");
        assert!(
            (parts - get("bound_above_alone_s") - over).abs() < 1e-6 * mean,
            "{row:?}"
        );
        // The node failures cost the jobs they struck.
        assert!(get("faults_s") > 0.0, "{row:?}");
    }
    assert!(
        report.contains("where the distance to the bound goes"),
        "{report}"
    );
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert!(
        summary
            .lines()
            .next()
            .unwrap()
            .contains(",restarts,restart_gpu_share,"),
        "{summary}"
    );
    assert!(
        std::fs::read(out.join("jobs.parquet"))
            .unwrap()
            .starts_with(b"PAR1")
    );
    // The charts name every policy in their legends.
    for chart in ["jct_cdf.svg", "utilisation.svg"] {
        let svg = std::fs::read_to_string(out.join(chart)).unwrap();
        assert!(svg.starts_with("<svg"), "{chart}");
        for p in POLICIES {
            assert!(svg.contains(&format!("\n{p}\n")), "{p} in {chart}");
        }
    }
}

/// The first `n` jobs of the Philly job list, replayed without profiles: rigid jobs that each
/// run exactly their duration on their GPUs.
#[test]
fn a_philly_job_list_replays_as_rigid_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(pollux().join("traces/philly-sample.csv")).unwrap();
    let lines: Vec<&str> = text.lines().take(301).collect();
    let trace = dir.path().join("philly-300.csv");
    std::fs::write(&trace, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("out");
    let run = brainctl(&[
        "whatif",
        "--trace",
        trace.to_str().unwrap(),
        "--cluster",
        "16x8:p100",
        "--round-s",
        "360",
        "--policy",
        policy("fifo").to_str().unwrap(),
        "--policy",
        policy("tiresias").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let table = table_of(run);
    for p in ["fifo", "tiresias"] {
        assert_eq!(&row(&table, p)[1..3], ["300", "300"], "{table}");
    }
    // Each job held exactly its GPUs for its duration plus one restart penalty per start.
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let csv = Csv::parse(&jobs);
    let col = |name: &str| csv.col(name);
    let fifo: Vec<&Vec<&str>> = csv
        .rows
        .iter()
        .filter(|c| c[col("policy")] == "fifo")
        .collect();
    for (row, line) in fifo.iter().zip(lines.iter().skip(1)) {
        let f: Vec<&str> = line.split(',').collect();
        let gpu_time: f64 = f[3].parse().unwrap();
        let gpus: f64 = f[2].parse().unwrap();
        let held: f64 = row[col("gpu_seconds")].parse().unwrap();
        assert!(
            (held - gpu_time - 30.0 * gpus).abs() < 1e-3,
            "{line}: {row:?}"
        );
        assert_eq!(row[col("application")], f[4]);
    }
}

/// `--live-round` replays through the live brain's round: the policy file's `[live]`
/// cool-down holds every running job at its size between resizes, so the same scheduler
/// resizes less often than on its own; a cluster of several GPU types is refused.
#[test]
fn a_replay_through_the_live_round_keeps_the_live_cool_down() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 24);
    let profiles = pollux().join("traces");
    let live = dir.path().join("pollux-live.toml");
    std::fs::write(
        &live,
        "[scheduler]\nkind = \"pollux\"\n[live]\ncooldown_s = 3600\n",
    )
    .unwrap();
    let run = |extra: &[&str], cluster: &str| {
        let mut args = vec![
            "whatif",
            "--trace",
            trace.to_str().unwrap(),
            "--profiles",
            profiles.to_str().unwrap(),
            "--cluster",
            cluster,
            "--policy",
            live.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        brainctl(&args)
    };
    let restarts = |out: &std::process::Output| -> u64 {
        let table = String::from_utf8_lossy(&out.stdout).to_string();
        let row = table
            .lines()
            .find(|l| l.starts_with("pollux-live"))
            .unwrap_or_else(|| panic!("{table}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[1..3], ["24", "24"], "every job finishes: {table}");
        // The restarts column: after policy, jobs, finished, mean, median and p99 JCT,
        // makespan, GPU utilisation and mean queueing.
        cells[9].replace(',', "").parse().unwrap()
    };
    let alone = run(&[], "8x4:t4");
    assert!(
        alone.status.success(),
        "{}",
        String::from_utf8_lossy(&alone.stderr)
    );
    let live_run = run(&["--live-round"], "8x4:t4");
    assert!(
        live_run.status.success(),
        "{}",
        String::from_utf8_lossy(&live_run.stderr)
    );
    assert!(
        restarts(&live_run) < restarts(&alone),
        "{} restarts through the live round, {} alone",
        restarts(&live_run),
        restarts(&alone)
    );
    let mixed = run(&["--live-round"], "8x4:t4,2x4:v100");
    assert!(!mixed.status.success());
    let said = String::from_utf8_lossy(&mixed.stderr);
    assert!(said.contains("the cluster has 2 GPU types"), "{said}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 3);
    let profiles = pollux().join("traces");
    let base = |policy: &Path, trace: &Path| {
        brainctl(&[
            "whatif",
            "--trace",
            trace.to_str().unwrap(),
            "--profiles",
            profiles.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
        ])
    };
    let no_scheduler = dir.path().join("lp.toml");
    std::fs::write(&no_scheduler, "[live]\ninterval_s = 5\n").unwrap();
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[scheduler]\nkind = \"pollux\"\nmax_grwth = 2\n").unwrap();
    let bad_trace = dir.path().join("bad.csv");
    std::fs::write(
        &bad_trace,
        "name,time,application,num_replicas,batch_size\na,10,bert,1,12\nb,20,bert,1.5,12\n",
    )
    .unwrap();
    let unknown_app = dir.path().join("unknown.csv");
    std::fs::write(
        &unknown_app,
        "name,time,application,num_replicas,batch_size\na,10,gpt9,1,12\n",
    )
    .unwrap();
    for (out, expected) in [
        (
            base(&dir.path().join("missing.toml"), &trace),
            "missing.toml: No such file",
        ),
        (base(&no_scheduler, &trace), "no [scheduler] table"),
        (base(&typo, &trace), "max_grwth"),
        (
            base(&policy("fifo"), &bad_trace),
            "bad.csv:3:4: `num_replicas` is 1.5, expected a whole number",
        ),
        (
            base(&policy("fifo"), &unknown_app),
            "no profile directory for application \"gpt9\"",
        ),
        (
            brainctl(&[
                "whatif",
                "--trace",
                trace.to_str().unwrap(),
                "--policy",
                policy("fifo").to_str().unwrap(),
                "--cluster",
                "16x0:t4",
            ]),
            "has no GPUs",
        ),
    ] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{expected}");
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in {stderr}"
        );
    }
    let help = brainctl(&["whatif", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--trace",
        "--policy",
        "--cluster",
        "--seed",
        "--out",
        "--round-s",
        "--restart-penalty-s",
        "--node-mtbf-s",
    ] {
        assert!(help.contains(flag), "{flag} in {help}");
    }
}

/// What no cluster or profile can honour is refused at load with `file:line:column` and the
/// reason, instead of being replayed into a wrong number (issue 23's four cases, and a Philly
/// list's).
#[test]
fn impossible_traces_are_refused_where_they_are_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let profiles = pollux().join("traces");
    let header = "name,time,application,num_replicas,batch_size\n";
    let cases = [
        (
            "j1,1e300,bert,2,32\n",
            "t.csv:2:2: `time` is 1e300 s, past the horizon",
        ),
        (
            "j1,0,bert,100000000,32\n",
            "t.csv:2:4: `num_replicas` is 100000000, but the cluster's largest GPU type has 64",
        ),
        (
            "j1,0,bert,2,99999999999\n",
            "t.csv:2:5: `batch_size` is 99999999999, outside the 12..384 that bert's training",
        ),
        (
            "j1,0,bert,2,32\nj1,5,bert,1,32\n",
            "t.csv:3:1: job name `j1` is already used on line 2",
        ),
    ];
    let fifo = policy("fifo");
    let replay = |trace: &Path, extra: &[&str]| {
        let mut args = vec![
            "whatif",
            "--trace",
            trace.to_str().unwrap(),
            "--profiles",
            profiles.to_str().unwrap(),
            "--policy",
            fifo.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        brainctl(&args)
    };
    for (rows, expected) in cases {
        let trace = dir.path().join("t.csv");
        std::fs::write(&trace, format!("{header}{rows}")).unwrap();
        assert_refused(&replay(&trace, &[]), expected);
    }
    // A stated horizon lets a late arrival through.
    let late = dir.path().join("late.csv");
    std::fs::write(&late, format!("{header}j1,1000000,bert,2,192\n")).unwrap();
    assert_refused(&replay(&late, &["--horizon-s", "86400"]), "late.csv:2:2:");
    table_of(replay(&late, &["--horizon-s", "2000000"]));
    // A Philly list: a job on more GPUs than one type has (33: more than the 16 P100 or the 32
    // K80, though not more than the cluster's 48), and an arrival past the horizon.
    let philly = dir.path().join("p.csv");
    let head = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,a\n";
    for (row, horizon, expected) in [
        (
            "2017-10-09 08:00:00,10.0,33,330.0,a\n",
            "1000000",
            "p.csv:3:3: `num_gpus` is 33, but the cluster's largest GPU type has 32",
        ),
        (
            "2017-10-11 07:01:55,10.0,2,20.0,a\n",
            "86400",
            "p.csv:3:1: `timestamp` is 172800 s after the first job, past the horizon of 86400 s",
        ),
    ] {
        std::fs::write(&philly, format!("{head}{row}")).unwrap();
        let out = brainctl(&[
            "whatif",
            "--trace",
            philly.to_str().unwrap(),
            "--cluster",
            "2x8:p100,8x4:k80",
            "--horizon-s",
            horizon,
            "--policy",
            policy("fifo").to_str().unwrap(),
        ]);
        assert_refused(&out, expected);
    }
}

/// `out` failed, said `expected` on stderr and replayed nothing.
fn assert_refused(out: &std::process::Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected {expected:?}, it ran: {stderr}"
    );
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in {stderr}"
    );
    assert!(out.stdout.is_empty(), "nothing replayed: {expected}");
}

/// `brainctl trace philly-like` draws a larger list from a real one by whole days; the list
/// it writes replays, and the same seed writes the same file.
#[test]
fn a_philly_like_trace_is_drawn_written_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let source = pollux().join("traces/philly-sample.csv");
    let draw = |out: &Path, seed: &str| {
        brainctl(&[
            "trace",
            "philly-like",
            "--from",
            source.to_str().unwrap(),
            "--jobs",
            "3000",
            "--seed",
            seed,
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
    let run = draw(&a, "1");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("wrote 3000 jobs"),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
    assert!(draw(&b, "1").status.success());
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    // Never overwritten; sizes no replay could hold are refused.
    let again = draw(&a, "2");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
    for jobs in ["0", "1000000000000"] {
        let out = brainctl(&[
            "trace",
            "philly-like",
            "--from",
            source.to_str().unwrap(),
            "--jobs",
            jobs,
            "--out",
            dir.path().join("c.csv").to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("expected 1 to 100000000"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let missing = brainctl(&[
        "trace",
        "philly-like",
        "--from",
        dir.path().join("nope.csv").to_str().unwrap(),
        "--out",
        dir.path().join("d.csv").to_str().unwrap(),
    ]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nope.csv"));
    assert!(!dir.path().join("d.csv").exists());
    let replay = brainctl(&[
        "whatif",
        "--trace",
        a.to_str().unwrap(),
        "--cluster",
        "64x8:p100",
        "--round-s",
        "360",
        "--policy",
        policy("elastic_lp").to_str().unwrap(),
    ]);
    let table = table_of(replay);
    assert_eq!(
        &row(&table, "elastic_lp")[1..3],
        ["3000", "3000"],
        "{table}"
    );
}

/// A replay cut by `--max-time-s` counts the jobs it did not finish as unfinished, says why
/// under the table and in `jobs.csv`, and keeps them out of the JCT columns.
#[test]
fn jobs_a_cut_replay_did_not_finish_are_unfinished_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 24);
    let out = dir.path().join("out");
    let run = brainctl(&[
        "whatif",
        "--trace",
        trace.to_str().unwrap(),
        "--profiles",
        pollux().join("traces").to_str().unwrap(),
        "--cluster",
        "8x4:t4",
        "--max-time-s",
        "3000",
        "--policy",
        policy("fifo").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let table = table_of(run);
    assert!(
        table.starts_with("JCT, queue, rho and eff train columns: finished jobs only\n"),
        "{table}"
    );
    let finished: u32 = row(&table, "fifo")[2].parse().unwrap();
    assert!(finished > 0 && finished < 24, "{table}");
    let note = format!(
        "fifo: {} unfinished ({} cut by max time)",
        24 - finished,
        24 - finished
    );
    assert!(table.contains(&note), "{note:?} in {table}");
    // The jobs table says which, and only those have no finish time.
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let csv = Csv::parse(&jobs);
    let col = |name: &str| csv.col(name);
    let mut cut = 0;
    for c in &csv.rows {
        let unfinished = c[col("unfinished")].trim_matches('"');
        assert_eq!(
            c[col("finish_s")].is_empty(),
            !unfinished.is_empty(),
            "{c:?}"
        );
        if !unfinished.is_empty() {
            assert_eq!(unfinished, "cut by max time");
            cut += 1;
        }
    }
    assert_eq!(cut, 24 - finished);
}

/// `--stream` replays a job list row by row: the same table as the replay in memory (its
/// median and p99 JCT within the sketch's 0.1 %), the same jobs and rounds in jobs.csv and
/// rounds.csv (in the order they were made; Parquet copies beside them), a cut replay's unfinished jobs too; a list out of
/// order, or a workload CSV, is refused before anything runs.
#[test]
fn a_streamed_replay_reports_what_the_replay_in_memory_does() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.csv");
    let drawn = brainctl(&[
        "trace",
        "philly-like",
        "--from",
        pollux().join("traces/philly-sample.csv").to_str().unwrap(),
        "--jobs",
        "3000",
        "--seed",
        "3",
        "--out",
        list.to_str().unwrap(),
    ]);
    assert!(drawn.status.success());
    let replay = |out: &Path, stream: bool| {
        let mut args = vec![
            "whatif",
            "--trace",
            list.to_str().unwrap(),
            "--cluster",
            "8x8:p100",
            "--round-s",
            "360",
            "--max-time-s",
            "2000000",
            "--out",
            out.to_str().unwrap(),
        ];
        let (fifo, ours) = (policy("fifo"), policy("elastic_lp"));
        args.extend(["--policy", fifo.to_str().unwrap()]);
        args.extend(["--policy", ours.to_str().unwrap()]);
        if stream {
            args.push("--stream");
        }
        table_of(brainctl(&args))
    };
    let (whole_dir, streamed_dir) = (dir.path().join("whole"), dir.path().join("streamed"));
    let whole = replay(&whole_dir, false);
    let streamed = replay(&streamed_dir, true);
    assert!(
        streamed.contains("median and p99 JCT: from a quantile sketch, within 0.1 %"),
        "{streamed}"
    );
    for p in ["fifo", "elastic_lp"] {
        let (a, b) = (row(&whole, p), row(&streamed, p));
        for (c, (x, y)) in a.iter().zip(&b).enumerate() {
            if c == 4 || c == 5 {
                // Printed to the second: within the sketch's accuracy, and a second of rounding.
                let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                assert!(
                    (x - y).abs() <= 1e-3 * x + 1.0,
                    "{p} column {c}: {x} vs {y}"
                );
            } else {
                assert_eq!(x, y, "{p} column {c}:\n{whole}\n{streamed}");
            }
        }
    }
    // The cut left jobs unfinished, said under both tables alike.
    let unfinished = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.contains("unfinished"))
            .map(str::to_string)
            .collect()
    };
    assert!(!unfinished(&whole).is_empty(), "{whole}");
    assert_eq!(unfinished(&whole), unfinished(&streamed));
    // The same rows; the whole table quotes an empty text, the streamed one leaves it empty.
    for table in ["jobs.csv", "rounds.csv"] {
        let rows = |d: &Path| {
            let text = std::fs::read_to_string(d.join(table)).unwrap();
            let mut rows: Vec<String> = text.lines().map(|l| l.replace("\"\"", "")).collect();
            let header = rows.remove(0);
            // decide_us is a wall-clock time.
            if table == "rounds.csv" {
                rows = rows
                    .iter()
                    .map(|r| r.rsplit_once(',').unwrap().0.to_string())
                    .collect();
            }
            rows.sort();
            (header, rows)
        };
        let (a, b) = (rows(&whole_dir), rows(&streamed_dir));
        assert_eq!(a.0, b.0, "{table}");
        assert_eq!(a.1.len(), b.1.len(), "{table}");
        assert!(a.1 == b.1, "{table} differs");
    }
    assert!(streamed_dir.join("summary.csv").exists());
    for t in ["jobs.parquet", "rounds.parquet", "summary.parquet"] {
        assert!(
            std::fs::metadata(streamed_dir.join(t)).unwrap().len() > 0,
            "{t}"
        );
    }

    // Out of order: refused at its line, before anything runs.
    let text = std::fs::read_to_string(&list).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.swap(5, 9);
    let shuffled = dir.path().join("shuffled.csv");
    std::fs::write(&shuffled, lines.join("\n") + "\n").unwrap();
    let run = |trace: &Path| {
        brainctl(&[
            "whatif",
            "--trace",
            trace.to_str().unwrap(),
            "--cluster",
            "8x8:p100",
            "--policy",
            policy("fifo").to_str().unwrap(),
            "--stream",
        ])
    };
    let out = run(&shuffled);
    assert_refused(&out, "shuffled.csv:7:");
    assert_refused(&out, "sort it by timestamp");
    // A workload CSV: not read row by row.
    let dir2 = tempfile::tempdir().unwrap();
    let workload = small_trace(dir2.path(), 5);
    assert_refused(&run(&workload), "replay it without --stream");
    // Profiles are for training jobs, which a streamed list has none of.
    let with_profiles = brainctl(&[
        "whatif",
        "--trace",
        list.to_str().unwrap(),
        "--profiles",
        pollux().join("traces").to_str().unwrap(),
        "--policy",
        policy("fifo").to_str().unwrap(),
        "--stream",
    ]);
    assert_refused(&with_profiles, "--profiles is not read with --stream");
}

/// A streamed replay that stops part way (here a job bigger than the cluster, past limits that
/// let it through) is an error naming the trace and policy, and the tables it had begun to
/// write can be removed: none is left to read as if it were complete.
#[test]
fn a_streamed_replay_that_stops_leaves_no_partial_tables() {
    use brain::whatif::{self, NamedPolicy, Options, StreamOutputs};
    use optimizer::schedule::{Fifo, SchedulerKind};
    use optimizer::sim::{ClusterSpec, SimConfig};

    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.csv");
    let mut text = String::from("timestamp,duration,num_gpus,gpu_time,cluster\n");
    // One job every 10 s, each 1 s on 1 GPU: the cluster keeps up, and most have finished,
    // and been written out, when the replay meets the last job.
    for i in 0..5000 {
        let t = i * 10;
        text.push_str(&format!(
            "2017-10-09 {:02}:{:02}:{:02},1,1,1,a\n",
            t / 3600,
            t / 60 % 60,
            t % 60
        ));
    }
    text.push_str("2017-10-09 23:00:00,60,16,960,a\n");
    std::fs::write(&list, text).unwrap();
    let cluster = ClusterSpec::parse("1x8:p100").unwrap();
    // Limits of a larger cluster: the check lets the 16-GPU job through, the replay does not.
    let limits = whatif::limits(&ClusterSpec::parse("2x8:p100").unwrap(), &[], 1e9);
    let traces =
        whatif::check_streamed(&[list], whatif::TraceFormat::Auto, &limits, &|_| {}).unwrap();
    assert_eq!(traces[0].jobs, 5001);
    let out = dir.path().join("out");
    let outputs = StreamOutputs::create(&out).unwrap();
    let policies = [NamedPolicy {
        label: "fifo".into(),
        scheduler: SchedulerKind::Fifo(Fifo::default()),
        live_round: None,
        handling: None,
    }];
    let options = Options {
        cluster,
        sim: SimConfig::default(),
        parallel: 1,
    };
    let e = whatif::run_streamed(
        &traces,
        &limits,
        &policies,
        &options,
        Some(&outputs),
        &|_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("simulating list under fifo") && e.contains("does not fit"),
        "{e}"
    );
    // The jobs that finished before it went out as they finished (a batch of 4,096 rows, all
    // but the writer's last buffer on disk).
    let written = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let lines = written.lines().count();
    assert!(lines > 4000, "{lines}");
    let removed = outputs.abandon();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0);
}

/// Faults from a fault trace and at a rate (issue 42, item 8): `--fault-handling both` gives
/// each policy a row per handling, side by side; a hang costs the step clock's 125 s when
/// detected and the collective's 30 minutes when not; every job still finishes; the jobs
/// table carries each job's faults, stalled GPU-seconds and effective training time; and bad
/// fault settings are refused by name.
#[test]
fn faults_are_detected_or_waited_out_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 24);
    let faults = dir.path().join("faults.csv");
    std::fs::write(
        &faults,
        "time_s,node,kind,seconds,factor\n3000,2,hang,600,\n3000,5,hang,600,\n",
    )
    .unwrap();
    let profiles = pollux().join("traces");
    let (fifo, elastic_lp) = (policy("fifo"), policy("elastic_lp"));
    let replay = |extra: &[&str], out: &Path| {
        let mut args = vec![
            "whatif",
            "--trace",
            trace.to_str().unwrap(),
            "--profiles",
            profiles.to_str().unwrap(),
            "--cluster",
            "8x4:t4",
            "--policy",
            fifo.to_str().unwrap(),
            "--policy",
            elastic_lp.to_str().unwrap(),
            "--fault-handling",
            "both",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        brainctl(&args)
    };
    // The scripted hangs alone: FIFO places the same jobs either way until they strike.
    let out = dir.path().join("hangs");
    let table = table_of(replay(&["--faults", faults.to_str().unwrap()], &out));
    // Columns: ... max rho (12), faults (13), stalled GPU % (14), eff train % (15).
    let stalled = |label: &str| -> f64 { row(&table, label)[14].parse().unwrap() };
    for label in [
        "fifo/detect",
        "fifo/wait",
        "elastic_lp/detect",
        "elastic_lp/wait",
    ] {
        assert_eq!(row(&table, label)[2], "24", "{label} finished all: {table}");
        assert!(
            row(&table, label)[13].parse::<u32>().unwrap() > 0,
            "{table}"
        );
    }
    assert!(
        stalled("fifo/wait") > 5.0 * stalled("fifo/detect") && stalled("fifo/detect") > 0.0,
        "{table}"
    );
    let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
    let csv = Csv::parse(&jobs);
    assert_eq!(csv.rows.len(), 4 * 24);
    let num = |cells: &Vec<&str>, name: &str| -> f64 { cells[csv.col(name)].parse().unwrap() };
    let mut struck = 0;
    for c in &csv.rows {
        let span = num(c, "finish_s") - num(c, "start_s");
        let eff = num(c, "effective_training");
        assert!(eff > 0.0 && eff <= 1.0 + 1e-9, "{c:?}");
        assert!((eff - num(c, "training_s") / span).abs() < 1e-6, "{c:?}");
        assert!(
            num(c, "stalled_gpu_seconds") <= num(c, "gpu_seconds"),
            "{c:?}"
        );
        if num(c, "faults") > 0.0 {
            struck += 1;
        }
    }
    assert!(struck > 0, "{jobs}");
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert!(
        summary.lines().next().unwrap().ends_with(
            ",faults,stalled_gpu_share,effective_training,lost_training_s,lost_per_fault_s,\
                 saving_gpu_share,slowest_round_ms"
        ),
        "{summary}"
    );
    // At a rate, with slowdowns: still every job once, under both handlings.
    let out = dir.path().join("rates");
    let table = table_of(replay(
        &[
            "--gpu-mtbf-s",
            "2e6",
            "--hang-share",
            "0.5",
            "--slowdown-mtbs-s",
            "40000",
            "--slowdown-s",
            "1800",
            "--seed",
            "3",
        ],
        &out,
    ));
    for label in [
        "fifo/detect",
        "fifo/wait",
        "elastic_lp/detect",
        "elastic_lp/wait",
    ] {
        assert_eq!(row(&table, label)[2], "24", "{label}: {table}");
    }
    // Bad settings: refused by name, nothing replayed.
    let bad_faults = dir.path().join("bad.csv");
    std::fs::write(
        &bad_faults,
        "time_s,node,kind,seconds,factor\n60,9,crash,60,\n",
    )
    .unwrap();
    for (extra, expected) in [
        (
            vec!["--faults", bad_faults.to_str().unwrap()],
            "bad.csv:2:2: node 9 is not in the cluster, whose nodes are 0 to 7",
        ),
        (
            vec!["--node-mtbf-s", "1e5", "--hang-share", "2"],
            "hang_share 2 is not in [0, 1]",
        ),
        (
            vec!["--slowdown-mtbs-s", "1e5", "--slowdown-factor", "1.5"],
            "factor 1.5",
        ),
        (
            vec!["--node-mtbf-s", "1e5", "--gpu-mtbf-s", "1e5"],
            "cannot be used with",
        ),
    ] {
        let out = dir.path().join("refused");
        let run = replay(&extra, &out);
        assert_refused(&run, expected);
        assert!(!out.exists(), "{extra:?} wrote {}", out.display());
    }
}

/// Work lost to failures (issue 43, item 6): with `--checkpoint-every-s`, a crash takes each
/// training job on the node back to its last save; the jobs table says how much training each
/// lost and what its saves held, the summary and the table the total; saving more often loses
/// less; bad checkpoint settings are refused by name.
#[test]
fn a_failure_loses_the_training_since_the_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 24);
    let faults = dir.path().join("faults.csv");
    std::fs::write(
        &faults,
        "time_s,node,kind,seconds,factor\n3000,2,crash,600,\n3000,5,crash,600,\n",
    )
    .unwrap();
    let profiles = pollux().join("traces");
    let fifo = policy("fifo");
    let replay = |extra: &[&str], out: &Path| {
        let mut args = vec![
            "whatif",
            "--trace",
            trace.to_str().unwrap(),
            "--profiles",
            profiles.to_str().unwrap(),
            "--cluster",
            "8x4:t4",
            "--policy",
            fifo.to_str().unwrap(),
            "--faults",
            faults.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        brainctl(&args)
    };
    let lost = |every: &str| {
        let out = dir.path().join(format!("every-{every}"));
        let table = table_of(replay(
            &["--checkpoint-every-s", every, "--checkpoint-save-s", "5"],
            &out,
        ));
        assert_eq!(row(&table, "fifo")[2], "24", "{table}");
        // Columns: ... eff train % (15), lost train s (16).
        let total: f64 = row(&table, "fifo")[16].parse().unwrap();
        let jobs = std::fs::read_to_string(out.join("jobs.csv")).unwrap();
        let csv = Csv::parse(&jobs);
        let per_job: Vec<(f64, f64, f64)> = csv
            .rows
            .iter()
            .map(|c| {
                let num = |name: &str| -> f64 { c[csv.col(name)].parse().unwrap() };
                (
                    num("lost_training_s"),
                    num("saving_gpu_seconds"),
                    num("faults"),
                )
            })
            .collect();
        // Only a job a fault struck lost training; every job that ran saved.
        assert!(
            per_job.iter().all(|&(l, _, f)| l == 0.0 || f > 0.0),
            "{jobs}"
        );
        assert!(per_job.iter().any(|&(_, s, _)| s > 0.0), "{jobs}");
        let sum: f64 = per_job.iter().map(|p| p.0).sum();
        assert!((sum - total).abs() <= 1.0, "{sum} vs {total}: {table}");
        let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
        assert!(summary.contains("lost_per_fault_s"), "{summary}");
        total
    };
    let (rarely, often) = (lost("1800"), lost("60"));
    assert!(rarely > 0.0, "the crashes cost training");
    assert!(
        often < rarely,
        "every 60 s: {often}, every 1800 s: {rarely}"
    );
    // Without a model nothing is lost.
    let table = table_of(replay(&[], &dir.path().join("none")));
    assert_eq!(row(&table, "fifo")[16], "0", "{table}");
    for (extra, expected) in [
        (vec!["--checkpoint-every-s", "0"], "checkpoint every_s is 0"),
        (
            vec!["--checkpoint-every-s", "60", "--checkpoint-save-s=-1"],
            "checkpoint save_s is -1",
        ),
        (
            vec!["--checkpoint-save-s", "5"],
            "--checkpoint-every-s <SECONDS>",
        ),
    ] {
        let out = dir.path().join("refused");
        let run = replay(&extra, &out);
        assert_refused(&run, expected);
        assert!(!out.exists(), "{extra:?} wrote {}", out.display());
    }
}

/// Rows named by `--label` (two policy files of one name are refused until labelled), progress
/// off a terminal as lines, and one utilisation chart per trace (issue 44, item 7).
#[test]
fn rows_are_labelled_progress_shows_off_a_terminal_and_each_trace_gets_its_chart() {
    let dir = tempfile::tempdir().unwrap();
    let first = small_trace(dir.path(), 12);
    let second = dir.path().join("second.csv");
    std::fs::copy(&first, &second).unwrap();
    // Two variants of one policy, both in files named policy.toml.
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (d, s) in [(&a, "fifo"), (&b, "tiresias")] {
        std::fs::create_dir(d).unwrap();
        std::fs::copy(policy(s), d.join("policy.toml")).unwrap();
    }
    let (pa, pb) = (a.join("policy.toml"), b.join("policy.toml"));
    let profiles = pollux().join("traces");
    let out = dir.path().join("out");
    let replay = |labels: &[&str]| {
        let mut args = vec![
            "whatif",
            "--trace",
            first.to_str().unwrap(),
            "--trace",
            second.to_str().unwrap(),
            "--profiles",
            profiles.to_str().unwrap(),
            "--policy",
            pa.to_str().unwrap(),
            "--policy",
            pb.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        for l in labels {
            args.extend(["--label", l]);
        }
        brainctl(&args)
    };
    let refused = replay(&[]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && err.contains("both be named \"policy\"")
            && err.contains("--label"),
        "{err}"
    );
    assert!(!out.exists(), "a refused replay writes nothing");
    let wrong = replay(&["only-one"]);
    assert!(!wrong.status.success());

    let done = replay(&["fifo-variant", "tiresias-variant"]);
    let progress = String::from_utf8_lossy(&done.stderr).into_owned();
    let table = table_of(done);
    assert_eq!(row(&table, "fifo-variant")[1], "24", "{table}");
    assert_eq!(row(&table, "tiresias-variant")[1], "24", "{table}");
    // Not a terminal here: progress comes as lines, the last at every job.
    assert!(
        progress.contains("whatif: 48/48 jobs finished (100 %)"),
        "{progress}"
    );
    for chart in ["utilisation-small.svg", "utilisation-second.svg"] {
        let svg = std::fs::read_to_string(out.join(chart)).unwrap();
        assert!(
            svg.contains("fifo-variant") && svg.contains("tiresias-variant"),
            "{chart}"
        );
    }
    assert!(!out.join("utilisation.svg").exists());
}

/// `--offline-slot-s`: the offline plan of a small trace, solved exactly, beside the bound;
/// its table written with `--out`; a slot off the rounds refused.
#[test]
fn the_offline_plan_of_a_small_trace_sits_above_the_bound_and_its_relaxation() {
    let dir = tempfile::tempdir().unwrap();
    let trace = small_trace(dir.path(), 8);
    let out = dir.path().join("out");
    let profiles = pollux().join("traces");
    let (trace, profiles, out_s) = (
        trace.display().to_string(),
        profiles.display().to_string(),
        out.display().to_string(),
    );
    let elastic = policy("elastic_lp").display().to_string();
    let base = [
        "whatif",
        "--trace",
        &trace,
        "--profiles",
        &profiles,
        "--cluster",
        "8x4:t4",
        "--policy",
        &elastic,
    ];
    let run = brainctl(&[&base[..], &["--offline-slot-s", "600", "--out", &out_s]].concat());
    let table = table_of(run);
    assert!(
        table.contains("offline plan (every arrival known, never resized, slots of 600 s"),
        "{table}"
    );
    assert!(table.contains("solved exactly"), "{table}");
    let split = &table[table.find("offline plan").unwrap()..];
    let cells = row(split, "elastic_lp");
    assert_eq!(cells.len(), 4, "{table}");
    // Over the bound, over the plan, and the plan over the bound: over × plan = bound's.
    let x = |c: &str| -> f64 { c.trim_end_matches('x').parse().unwrap() };
    assert!(
        (x(cells[2]) * x(cells[3]) - x(cells[1])).abs() < 0.02,
        "{table}"
    );
    let text = std::fs::read_to_string(out.join("offline.csv")).unwrap();
    let csv = Csv::parse(&text);
    let get = |c: &str| -> f64 { csv.rows[0][csv.col(c)].parse().unwrap() };
    assert_eq!(csv.rows[0][csv.col("exact")], "true");
    assert_eq!(get("jobs"), 8.0);
    assert!(
        get("relaxation_mean_jct_s") <= get("model_mean_jct_s") + 1e-6,
        "{text}"
    );
    assert!(get("mean_jct_s") >= get("bound_mean_jct_s"), "{text}");
    assert!(out.join("offline.parquet").exists());

    let off_round = brainctl(&[&base[..], &["--offline-slot-s", "90"]].concat());
    assert_refused(&off_round, "not a multiple of the 60 s round");
    let too_big = brainctl(
        &[
            &base[..],
            &["--offline-slot-s", "60", "--offline-max-variables", "100"],
        ]
        .concat(),
    );
    assert_refused(&too_big, "more than the 100 allowed");
    let alone = brainctl(&[&base[..], &["--offline-exact-variables", "10"]].concat());
    assert_refused(&alone, "--offline-slot-s");
}
