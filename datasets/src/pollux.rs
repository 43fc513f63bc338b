//! Pollux's (and Sia's) simulator data: job workloads and application profiles (the Philly job
//! list Pollux also ships is read by [`crate::philly`]).
//!
//! * Workload CSV: `name,time,application,num_replicas,batch_size` (one job per line, `time` in
//!   seconds from the start).
//! * Application directory `<app>/`: `placements.csv` (`placement,local_bsz,step_time,sync_time`,
//!   placement = one digit per node, the GPUs used on it), `scalability.csv`
//!   (`num_nodes,num_replicas,local_bsz,step_time,sync_time`) and `validation-<B>.csv`
//!   (`progress,iteration,metric,grad_sqr,grad_var`, one line per epoch at total batch `B`).
//!   Sia adds `placements-<gpu>.csv` and `scalability-<gpu>.csv` per GPU type, columns in any
//!   order.

use std::collections::BTreeMap;
use std::path::Path;

use optimizer::sim::{AppLimits, AppProfile, CurveRow, StepRow, TraceJob, Work};

use crate::DatasetError;
use crate::limits::TraceLimits;
use crate::table::{Layout, Table};

/// The GPU type of the files without a suffix (Pollux measured on AWS g4dn, 4 × T4 per node).
pub const DEFAULT_GPU: &str = "t4";

/// Reads a workload CSV.
pub fn read_workload(path: &Path) -> Result<Vec<TraceJob>, DatasetError> {
    let t = Table::read(
        path,
        Layout::csv(&["name", "time", "application", "num_replicas", "batch_size"]),
    )?;
    (0..t.rows())
        .map(|i| {
            Ok(TraceJob {
                name: t.text(i, 0)?.to_string(),
                submit_s: t.number(i, 1, 0.0)?,
                requested_replicas: t.count(i, 3, 1)? as u32,
                work: Work::Train {
                    application: t.text(i, 2)?.trim().to_string(),
                    batch_size: t.count(i, 4, 1)? as u32,
                },
            })
        })
        .collect()
}

/// Checks a workload CSV against what the replay can honour: unique job names, arrivals within
/// the horizon, requests no larger than the cluster's largest GPU type, batch sizes within the
/// application's training curves (applications without a profile are left to the replay, which
/// refuses them by name).
pub fn check_workload(path: &Path, limits: &TraceLimits) -> Result<(), DatasetError> {
    let t = Table::read(
        path,
        Layout::csv(&["name", "time", "application", "num_replicas", "batch_size"]),
    )?;
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for i in 0..t.rows() {
        let name = t.text(i, 0)?.trim();
        if let Some(first) = seen.insert(name, i) {
            return Err(t.error(
                i,
                0,
                format!(
                    "job name `{name}` is already used on line {}; names key the per-job results",
                    t.line(first)
                ),
            ));
        }
        let at = t.number(i, 1, 0.0)?;
        if at > limits.horizon_s {
            return Err(t.error(
                i,
                1,
                format!(
                    "`time` is {} s, past the horizon of {} s (--horizon-s)",
                    t.text(i, 1)?.trim(),
                    limits.horizon_s
                ),
            ));
        }
        let replicas = t.count(i, 3, 1)?;
        if replicas > u64::from(limits.largest_type_gpus) {
            return Err(t.error(
                i,
                3,
                format!(
                    "`num_replicas` is {replicas}, but the cluster's largest GPU type has {} GPUs",
                    limits.largest_type_gpus
                ),
            ));
        }
        let app = t.text(i, 2)?.trim();
        let batch = t.count(i, 4, 1)?;
        if let Some(&(lo, hi)) = limits.batch_sizes.get(app)
            && !(u64::from(lo)..=u64::from(hi)).contains(&batch)
        {
            return Err(t.error(
                i,
                4,
                format!(
                    "`batch_size` is {batch}, outside the {lo}..{hi} that {app}'s training \
                     curves cover"
                ),
            ));
        }
    }
    Ok(())
}

/// What Pollux's artifact sets for its six applications (`applications.py`): epochs to train and
/// the trainer's limits.
pub fn pollux_limits(app: &str) -> AppLimits {
    let epochs = |e| AppLimits {
        max_epochs: Some(e),
        ..AppLimits::default()
    };
    match app {
        "bert" => epochs(2),
        "cifar10" => epochs(100),
        "ncf" => AppLimits {
            max_replicas: Some(1),
            fixed_batch_size: Some(32768),
            ..epochs(10)
        },
        "imagenet" => epochs(90),
        "deepspeech2" => epochs(80),
        "yolov3" => AppLimits {
            max_local_bsz: Some(8),
            ..epochs(50)
        },
        _ => AppLimits::default(),
    }
}

fn step_rows(path: &Path, named_placement: bool) -> Result<Vec<StepRow>, DatasetError> {
    let t = Table::read_any_order(
        path,
        if named_placement {
            &["placement", "local_bsz", "step_time", "sync_time"]
        } else {
            &[
                "num_nodes",
                "num_replicas",
                "local_bsz",
                "step_time",
                "sync_time",
            ]
        },
    )?;
    let col = |n: &str| t.column(n).expect("checked by read_any_order");
    (0..t.rows())
        .map(|i| {
            let (placement, nodes, replicas) = if named_placement {
                let c = col("placement");
                let text = t.text(i, c)?.trim();
                let digits: Option<Vec<u32>> = text.chars().map(|ch| ch.to_digit(10)).collect();
                match digits {
                    Some(d) if !d.is_empty() && d.iter().all(|&g| g > 0) => {
                        let (n, r) = (d.len() as u32, d.iter().sum());
                        (Some(d), n, r)
                    }
                    _ => {
                        return Err(t.error(
                            i,
                            c,
                            format!("placement `{text}` is not one digit 1-9 per node"),
                        ));
                    }
                }
            } else {
                (
                    None,
                    t.count(i, col("num_nodes"), 1)? as u32,
                    t.count(i, col("num_replicas"), 1)? as u32,
                )
            };
            let step_time = t.number(i, col("step_time"), 0.0)?;
            let sync_time = t.number(i, col("sync_time"), 0.0)?;
            if step_time <= 0.0 || sync_time > step_time {
                return Err(t.error(
                    i,
                    col("step_time"),
                    format!("step time {step_time} with sync time {sync_time}"),
                ));
            }
            Ok(StepRow {
                placement,
                nodes,
                replicas,
                local_bsz: t.number(i, col("local_bsz"), 1.0)?,
                step_time,
                sync_time,
            })
        })
        .collect()
}

fn curve_rows(path: &Path) -> Result<Vec<CurveRow>, DatasetError> {
    let t = Table::read(
        path,
        Layout::csv(&["progress", "iteration", "metric", "grad_sqr", "grad_var"]),
    )?;
    (0..t.rows())
        .map(|i| {
            Ok(CurveRow {
                progress: t.number(i, 0, 0.0)?,
                iteration: t.number(i, 1, 0.0)?,
                metric: t.parse(i, 2)?,
                grad_sqr: t.number(i, 3, 0.0)?,
                grad_var: t.number(i, 4, 0.0)?,
            })
        })
        .collect()
}

/// Reads one application directory; `limits` are the trainer's (see [`pollux_limits`]).
pub fn read_app(dir: &Path, limits: AppLimits) -> Result<AppProfile, DatasetError> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let entries = std::fs::read_dir(dir).map_err(|source| DatasetError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<std::path::PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    let mut steps: BTreeMap<String, Vec<StepRow>> = BTreeMap::new();
    let mut curves = BTreeMap::new();
    for f in &files {
        let stem = f
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let (kind, suffix) = match stem.split_once('-') {
            Some((k, s)) => (k.to_string(), Some(s.to_string())),
            None => (stem.clone(), None),
        };
        match (kind.as_str(), suffix) {
            ("placements" | "scalability", gpu) => {
                let rows = step_rows(f, kind == "placements")?;
                steps
                    .entry(gpu.unwrap_or_else(|| DEFAULT_GPU.to_string()))
                    .or_default()
                    .extend(rows);
            }
            ("validation", Some(b)) => {
                let batch: u32 = b.parse().map_err(|_| {
                    DatasetError::format(f, "expected validation-<total batch size>.csv")
                })?;
                curves.insert(batch, curve_rows(f)?);
            }
            _ => {}
        }
    }
    if steps.is_empty() || curves.is_empty() {
        return Err(DatasetError::format(
            dir,
            "an application directory needs placements*.csv and validation-<B>.csv files",
        ));
    }
    Ok(AppProfile {
        name,
        steps,
        curves,
        limits,
    })
}

/// Reads every application directory under `traces` (e.g. Pollux's `traces/`), with Pollux's
/// limits for the applications it names.
pub fn read_apps(traces: &Path) -> Result<Vec<AppProfile>, DatasetError> {
    let entries = std::fs::read_dir(traces).map_err(|source| DatasetError::Io {
        path: traces.to_path_buf(),
        source,
    })?;
    let mut dirs: Vec<std::path::PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|d| {
            let name = d
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            read_app(d, pollux_limits(&name))
        })
        .collect()
}

/// Reads the application directories `names` of `traces` (each once, in the order given): a
/// trace needs only the profiles of the applications it runs.
pub fn read_apps_named(traces: &Path, names: &[&str]) -> Result<Vec<AppProfile>, DatasetError> {
    let mut seen = std::collections::BTreeSet::new();
    names
        .iter()
        .filter(|n| seen.insert(**n))
        .map(|name| {
            let dir = traces.join(name);
            if !dir.is_dir() {
                return Err(DatasetError::format(
                    &dir,
                    format!("no profile directory for application {name:?}"),
                ));
            }
            read_app(&dir, pollux_limits(name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> std::path::PathBuf {
        crate::bundled().join("pollux")
    }

    #[test]
    fn pollux_workloads_and_applications_read() {
        let jobs = read_workload(&data().join("workloads/workload-1.csv")).unwrap();
        assert_eq!(jobs.len(), 160);
        assert_eq!(jobs[0].name, "cifar10-0");
        assert_eq!((jobs[0].submit_s, jobs[0].requested_replicas), (107.0, 6));
        assert_eq!(
            jobs[0].work,
            Work::Train {
                application: "cifar10".into(),
                batch_size: 2048
            }
        );
        let apps = read_apps(&data().join("traces")).unwrap();
        let names: Vec<&str> = apps.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "bert",
                "cifar10",
                "deepspeech2",
                "imagenet",
                "ncf",
                "yolov3"
            ]
        );
        let bert = &apps[0];
        assert_eq!(bert.steps.keys().collect::<Vec<_>>(), ["t4"]);
        assert_eq!(
            bert.curves.keys().copied().collect::<Vec<_>>(),
            [12, 24, 48, 96, 192, 384]
        );
        assert_eq!(bert.limits.max_epochs, Some(2));
        for app in &apps {
            optimizer::sim::App::new(app).unwrap();
        }
    }

    #[test]
    fn a_malformed_row_names_its_file_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.csv");
        std::fs::write(
            &p,
            "name,time,application,num_replicas,batch_size\na,1,bert,2,12\nb,2,bert,two,12\n",
        )
        .unwrap();
        let e = read_workload(&p).unwrap_err().to_string();
        assert!(
            e.ends_with(
                "w.csv:3:4: `num_replicas` `two` is not a valid value: invalid float literal"
            ),
            "{e}"
        );
        std::fs::write(
            &p,
            "name,time,application,num_replicas,batch_size\na,-1,bert,2,12\n",
        )
        .unwrap();
        let e = read_workload(&p).unwrap_err().to_string();
        assert!(e.contains("w.csv:2:2: `time` is -1"), "{e}");
        std::fs::write(&p, "name,time,app\na,1,bert\n").unwrap();
        let e = read_workload(&p).unwrap_err().to_string();
        assert!(e.contains("header is `name,time,app`"), "{e}");
        std::fs::write(
            &p,
            "name,time,application,num_replicas,batch_size\na,1,bert,2\n",
        )
        .unwrap();
        let e = read_workload(&p).unwrap_err().to_string();
        assert!(e.contains("w.csv:2:5: `batch_size` is missing"), "{e}");
        let e = read_workload(&dir.path().join("none.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.csv") && e.contains("No such file"), "{e}");
    }

    #[test]
    fn a_bad_placement_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let app = dir.path().join("toy");
        std::fs::create_dir(&app).unwrap();
        std::fs::write(
            app.join("placements.csv"),
            "placement,local_bsz,step_time,sync_time\n1,4,0.5,0.0\n2x,4,0.5,0.1\n",
        )
        .unwrap();
        std::fs::write(
            app.join("validation-8.csv"),
            "progress,iteration,metric,grad_sqr,grad_var\n1,1,1,1,1\n",
        )
        .unwrap();
        let e = read_app(&app, AppLimits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("placements.csv:3:1: placement `2x`"), "{e}");
    }
}
