//! Traces drawn from a real trace's distribution, for replays larger than any public trace
//! (`brainctl trace philly-like`).
//!
//! [`philly_like`] is a day-block bootstrap of a Philly job list: the source is cut into days
//! counted from its first submission, and each day of the new trace is one of those days drawn
//! at random with replacement, every job of it kept whole (its time of day, duration, GPUs and
//! virtual cluster). Drawing days rather than single jobs keeps what a replay is sensitive to:
//! the diurnal rhythm, the bursts (hundreds of jobs within an hour), which sizes and durations
//! arrive together, the quiet days; so the arrival rate, and with it the load a cluster sees,
//! stay the source's. The last day drawn is cut at the number of jobs asked for.
//!
//! [`write_philly`] writes such a trace in the Philly list's own format, so it is read back by
//! [`crate::philly::read_jobs`] like the real one.

use std::path::Path;

use chrono::NaiveDateTime;
use optimizer::sim::{TraceJob, Work};
use polars::prelude::*;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

use crate::DatasetError;

const DAY_S: f64 = 86_400.0;

/// `jobs` rigid jobs drawn from `source` (a Philly job list as [`crate::philly::read_jobs`]
/// gives it) by whole days; the same source and seed give the same trace. Jobs are in order of
/// submission, named `synth-<n>`.
pub fn philly_like(
    source: &[TraceJob],
    jobs: usize,
    seed: u64,
) -> Result<Vec<TraceJob>, DatasetError> {
    let bad = |m: String| DatasetError::Synth(m);
    if source.is_empty() {
        return Err(bad("the source trace has no jobs".into()));
    }
    // Each source day: its jobs by time of day.
    let last = source.iter().map(|j| j.submit_s).fold(0.0, f64::max);
    let mut days: Vec<Vec<&TraceJob>> = vec![Vec::new(); (last / DAY_S) as usize + 1];
    for j in source {
        if !matches!(j.work, Work::Rigid { .. }) {
            return Err(bad(format!(
                "job {} of the source is not a rigid job (a Philly job list has only those)",
                j.name
            )));
        }
        if !(j.submit_s.is_finite() && j.submit_s >= 0.0) {
            return Err(bad(format!(
                "job {} of the source is submitted at {} s",
                j.name, j.submit_s
            )));
        }
        days[(j.submit_s / DAY_S) as usize].push(j);
    }
    for d in &mut days {
        d.sort_by(|a, b| a.submit_s.total_cmp(&b.submit_s));
    }
    let mut rng = Pcg64::seed_from_u64(seed);
    let mut out = Vec::with_capacity(jobs.min(1 << 24));
    let mut day = 0u64;
    while out.len() < jobs {
        let drawn = &days[rng.random_range(0..days.len())];
        let start = day as f64 * DAY_S;
        for j in drawn.iter().take(jobs - out.len()) {
            out.push(TraceJob {
                name: format!("synth-{}", out.len() + 1),
                submit_s: start + j.submit_s.rem_euclid(DAY_S),
                ..(*j).clone()
            });
        }
        day += 1;
    }
    Ok(out)
}

/// Writes `jobs` (rigid jobs) as a Philly job list whose first second is `start`:
/// `timestamp,duration,num_gpus,gpu_time,cluster`, submission times rounded down to the second.
pub fn write_philly(
    path: &Path,
    jobs: &[TraceJob],
    start: NaiveDateTime,
) -> Result<(), DatasetError> {
    let fail = |m: String| DatasetError::Write {
        path: path.to_path_buf(),
        message: m,
    };
    let mut stamps = Vec::with_capacity(jobs.len());
    let mut durations = Vec::with_capacity(jobs.len());
    let mut gpus = Vec::with_capacity(jobs.len());
    let mut gpu_time = Vec::with_capacity(jobs.len());
    let mut clusters = Vec::with_capacity(jobs.len());
    for j in jobs {
        let Work::Rigid { duration_s, label } = &j.work else {
            return Err(fail(format!("job {} is not a rigid job", j.name)));
        };
        let at = start + chrono::Duration::seconds(j.submit_s.floor() as i64);
        stamps.push(at.format("%Y-%m-%d %H:%M:%S").to_string());
        durations.push(*duration_s);
        gpus.push(j.requested_replicas);
        gpu_time.push(duration_s * f64::from(j.requested_replicas));
        clusters.push(label.as_str());
    }
    let mut df = DataFrame::new_infer_height(vec![
        Column::new("timestamp".into(), stamps),
        Column::new("duration".into(), durations),
        Column::new("num_gpus".into(), gpus),
        Column::new("gpu_time".into(), gpu_time),
        Column::new("cluster".into(), clusters),
    ])
    .map_err(|e| fail(e.to_string()))?;
    let file = std::fs::File::create(path).map_err(|source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    CsvWriter::new(std::io::BufWriter::new(file))
        .finish(&mut df)
        .map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn rigid(name: &str, submit_s: f64, gpus: u32, duration_s: f64, label: &str) -> TraceJob {
        TraceJob {
            name: name.into(),
            submit_s,
            requested_replicas: gpus,
            work: Work::Rigid {
                duration_s,
                label: label.into(),
            },
        }
    }

    /// Three source days: a busy one (a burst of 8-GPU jobs in its first hour), a quiet one
    /// (nothing), and one with a single job late in the day.
    fn source() -> Vec<TraceJob> {
        let mut s: Vec<TraceJob> = (0..10)
            .map(|i| rigid(&format!("b{i}"), 60.0 * i as f64, 8, 3600.0, "busy"))
            .collect();
        s.push(rigid("late", 2.0 * DAY_S + 80_000.0, 1, 10.0, "late"));
        s
    }

    #[test]
    fn days_are_drawn_whole_and_keep_their_time_of_day() {
        let jobs = philly_like(&source(), 1_000, 7).unwrap();
        assert_eq!(jobs.len(), 1_000);
        assert!(jobs.windows(2).all(|w| w[0].submit_s <= w[1].submit_s));
        let mut per_day: BTreeMap<u64, Vec<&TraceJob>> = BTreeMap::new();
        for j in &jobs {
            per_day
                .entry((j.submit_s / DAY_S) as u64)
                .or_default()
                .push(j);
        }
        let (&last_day, _) = per_day.last_key_value().unwrap();
        for (&d, js) in &per_day {
            let of_day: Vec<f64> = js.iter().map(|j| j.submit_s - d as f64 * DAY_S).collect();
            match js[0].label() {
                // A busy day: its burst, whole (the trace's last day may be cut).
                "busy" => {
                    assert!(js.len() == 10 || d == last_day, "{d}: {}", js.len());
                    for (k, (j, t)) in js.iter().zip(&of_day).enumerate() {
                        assert_eq!(*t, 60.0 * k as f64);
                        assert_eq!((j.requested_replicas, j.label()), (8, "busy"));
                    }
                }
                "late" => assert_eq!((js.len(), of_day[0]), (1, 80_000.0)),
                other => panic!("{other}"),
            }
        }
        // Quiet days are drawn too: about a third of the days have no job.
        let days = last_day + 1;
        let quiet = days - per_day.len() as u64;
        assert!(quiet * 5 > days && quiet * 2 < days, "{quiet} of {days}");
        // The same seed, the same trace; another seed, another.
        assert_eq!(philly_like(&source(), 1_000, 7).unwrap(), jobs);
        assert_ne!(philly_like(&source(), 1_000, 8).unwrap(), jobs);
        assert_eq!(jobs[999].name, "synth-1000");
    }

    #[test]
    fn a_drawn_trace_has_the_source_mix_of_sizes() {
        // The bundled sample of the Philly list: the share of multi-GPU jobs survives the draw.
        let path = crate::bundled().join("pollux/traces/philly-sample.csv");
        let real = crate::philly::read_jobs(&path).unwrap();
        let drawn = philly_like(&real, 20_000, 1).unwrap();
        let share = |js: &[TraceJob]| {
            js.iter().filter(|j| j.requested_replicas > 1).count() as f64 / js.len() as f64
        };
        let (a, b) = (share(&real), share(&drawn));
        assert!((a - b).abs() < 0.05, "multi-GPU share {a} vs {b}");
        let gpu_s = |js: &[TraceJob]| {
            js.iter()
                .map(|j| match j.work {
                    Work::Rigid { duration_s, .. } => duration_s * j.requested_replicas as f64,
                    _ => 0.0,
                })
                .sum::<f64>()
                / js.len() as f64
        };
        let (a, b) = (gpu_s(&real), gpu_s(&drawn));
        assert!((a / b - 1.0).abs() < 0.5, "GPU-seconds per job {a} vs {b}");
    }

    #[test]
    fn a_written_trace_reads_back_as_the_same_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synth.csv");
        let jobs = philly_like(&source(), 25, 3).unwrap();
        let start =
            NaiveDateTime::parse_from_str("2017-10-03 08:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        write_philly(&path, &jobs, start).unwrap();
        let back = crate::philly::read_jobs(&path).unwrap();
        assert_eq!(back.len(), jobs.len());
        let first = jobs[0].submit_s;
        for (a, b) in jobs.iter().zip(&back) {
            assert_eq!(a.submit_s - first, b.submit_s);
            assert_eq!(
                (a.requested_replicas, &a.work),
                (b.requested_replicas, &b.work)
            );
        }
        // Times count from `start`: the first job's stamp is `start` plus its submission.
        let first_stamp = (start + chrono::Duration::seconds(first as i64))
            .format("%Y-%m-%d %H:%M:%S")
            .to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let head = format!("timestamp,duration,num_gpus,gpu_time,cluster\n{first_stamp},");
        assert!(text.starts_with(&head), "{text}");
    }

    #[test]
    fn a_source_with_nothing_to_draw_is_refused() {
        let e = philly_like(&[], 10, 0).unwrap_err();
        assert!(e.to_string().contains("no jobs"), "{e}");
        let mut s = source();
        s[0].work = Work::Train {
            application: "bert".into(),
            batch_size: 8,
        };
        let e = philly_like(&s, 10, 0).unwrap_err();
        assert!(e.to_string().contains("not a rigid job"), "{e}");
    }
}
