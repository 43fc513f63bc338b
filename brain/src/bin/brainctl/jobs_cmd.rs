//! `brainctl jobs` and `brainctl status`: the brain's jobs with their metric summaries (a
//! running job's samples/s is its speed over the last 30 s, an ended one's its mean), GPU use
//! and plan versions, and one job in full (size, why, why it waits, plans, master, outcome).

use brain::console::pages::{count_of, trainer, training};
use proto::service::v1 as pb;

use crate::link::{ask_brain, job_id};

/// `brainctl jobs`.
pub fn jobs(brain: &str) -> anyhow::Result<()> {
    let jobs = ask_brain(brain, async |mut c| {
        Ok(c.list_jobs(pb::ListJobsRequest {}).await?.into_inner().jobs)
    })?;
    print_jobs(&jobs);
    Ok(())
}

/// `brainctl status JOB`.
pub fn status(job: &str, brain: &str) -> anyhow::Result<()> {
    let record = ask_brain(brain, async |mut c| {
        let id = job_id(&mut c, job).await?;
        Ok(c.get_job(pb::GetJobRequest { job_id: id })
            .await?
            .into_inner())
    })?;
    print_jobs(std::slice::from_ref(&record));
    if let Some(shape) = &record.shape {
        print_shape(shape);
    }
    if !record.reasons.is_empty() {
        say!("sized by the brain because:");
        for r in &record.reasons {
            say!("  - {r}");
        }
    }
    say!(
        "master: {}",
        if record.master_address.is_empty() {
            "(not started)"
        } else {
            &record.master_address
        }
    );
    if !record.run_dir.is_empty() {
        say!("run directory: {}", record.run_dir);
    }
    if !record.waiting_reason.is_empty() {
        say!("waiting: {}", record.waiting_reason);
    }
    if record.recent_samples_per_second > 0.0 {
        say!(
            "speed now: {:.1} samples/s (the last 30 s of reports; {:.1} on average since it \
             started)",
            record.recent_samples_per_second,
            record.mean_samples_per_second
        );
    }
    say!("samples trained: {}", record.samples_done);
    if !record.plans.is_empty() {
        say!("plans (newest first):");
        for p in &record.plans {
            let answer = if p.answer.is_empty() {
                "not answered yet"
            } else {
                &p.answer
            };
            say!("  v{} {}: {answer}", p.version, p.reason);
        }
    }
    if !record.outcome.is_empty() {
        say!("outcome: {}", record.outcome);
    }
    Ok(())
}

pub fn print_jobs(jobs: &[pb::JobRecord]) {
    say!(
        "{:>4}  {:<24} {:<9} {:>7} {:>8} {:>12} {:>12} {:>9} {:>6} {:>8}  plan (newest/accepted/reached)",
        "id",
        "name",
        "state",
        "workers",
        "reports",
        "last step",
        "samples/s",
        "peak MiB",
        "gpu %",
        "gpu MiB"
    );
    for j in jobs {
        let workers = j.shape.as_ref().map_or("-".to_string(), |s| {
            let (n, ps) = (count_of(s, trainer(s)), count_of(s, "ps"));
            if s.kind == "ps" && ps > 0 {
                format!("{n}+{ps}ps")
            } else if trainer(s) != "worker" {
                // A training group named otherwise says its name: `4 actor`.
                format!("{n} {}", trainer(s))
            } else {
                n.to_string()
            }
        });
        let (gpu_pct, gpu_mib) = if j.gpu_processes.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.0}", j.gpu_utilisation_pct),
                (j.gpu_memory_bytes >> 20).to_string(),
            )
        };
        say!(
            "{:>4}  {:<24} {:<9} {:>7} {:>8} {:>12} {:>12.1} {:>9} {:>6} {:>8}  {}/{}/{}",
            j.job_id,
            j.job_name,
            j.state,
            workers,
            j.reports,
            j.last_global_step,
            if j.state == "running" && j.recent_samples_per_second > 0.0 {
                j.recent_samples_per_second
            } else {
                j.mean_samples_per_second
            },
            j.peak_memory_bytes >> 20,
            gpu_pct,
            gpu_mib,
            j.plan_version,
            j.acked_version,
            j.reached_version
        );
        if !j.gpu_processes.is_empty() {
            let each: Vec<String> = j
                .gpu_processes
                .iter()
                .map(|p| {
                    format!(
                        "{}-{} {:.0}% {} MiB",
                        p.role,
                        p.index,
                        p.utilisation_pct,
                        p.memory_bytes >> 20
                    )
                })
                .collect();
            say!("      gpu: {}", each.join(", "));
        }
    }
}

pub fn print_shape(s: &pb::JobShape) {
    let res = |r: &Option<proto::jobmaster::v1::Resources>| {
        r.as_ref().map_or("-".to_string(), |r| {
            format!(
                "{}m cpu, {} MiB{}",
                r.cpu_millicores,
                r.memory_bytes >> 20,
                if r.gpu_milli > 0 {
                    format!(", {} gpu", vocab::Gpus::from_milli(r.gpu_milli))
                } else {
                    String::new()
                }
            )
        })
    };
    let trainer = match trainer(s) {
        "worker" => "workers".to_string(),
        name => format!("{name} (its training group)"),
    };
    if let Some(t) = training(s) {
        say!(
            "{} job: {} {trainer} (min {}, max {}, node unit {}) of {}",
            s.kind,
            t.count,
            t.min,
            t.max,
            t.node_unit,
            res(&t.resources)
        );
    }
    for r in s.roles.iter().filter(|r| !r.training) {
        if s.kind == "ps" && r.role == "ps" {
            if r.count > 0 {
                say!("  {} ps of {}", r.count, res(&r.resources));
            }
            continue;
        }
        say!(
            "  {} {} ({}, min {}, max {}) of {}",
            r.count,
            r.role,
            r.topology,
            r.min,
            r.max,
            res(&r.resources)
        );
    }
    say!("  {} samples to train", s.total_samples);
}
