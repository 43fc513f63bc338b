//! `brainctl plan --dry-run`: what the brain's next round would decide for every queued and
//! running job, and why, dispatching nothing.

use anyhow::bail;
use proto::service::v1 as pb;

use crate::link::ask_brain;

pub fn plan(dry_run: bool, brain: &str) -> anyhow::Result<()> {
    if !dry_run {
        bail!(
            "the brain dispatches plans itself every round; `brainctl plan --dry-run` \
             shows what the next one would decide"
        );
    }
    let r = ask_brain(brain, async |mut c| {
        Ok(c.dry_run(pb::DryRunRequest {}).await?.into_inner())
    })?;
    println!(
        "scheduler {}: {:.1} of {:.1} CPUs, {} of {} processes after the round (solved in {:.2} ms)",
        r.scheduler,
        r.cpu_millicores as f64 / 1000.0,
        r.capacity_millicores as f64 / 1000.0,
        r.processes,
        r.max_processes,
        r.solve_ms
    );
    for note in &r.notes {
        println!("note: {note}");
    }
    for d in &r.decisions {
        let corrected = d.ps != d.to_ps || !d.migrations.is_empty() || !d.role_targets.is_empty();
        let change = if d.from_workers == d.to_workers && corrected {
            "corrects".to_string()
        } else if d.from_workers == d.to_workers {
            "keeps".to_string()
        } else if d.state == "queued" && d.to_workers > 0 {
            "starts".to_string()
        } else if d.state == "queued" {
            "waits".to_string()
        } else {
            "resizes".to_string()
        };
        println!(
            "{:>4} {:<24} {:<8} {change} {} -> {} workers{} (predicted {:.0} samples/s)",
            d.job_id,
            d.job_name,
            d.state,
            d.from_workers,
            d.to_workers,
            match (d.ps, d.to_ps) {
                (0, 0) => String::new(),
                (a, b) if a == b => format!(" + {a} ps"),
                (a, b) => format!(" + {a} -> {b} ps"),
            },
            d.predicted_samples_per_second
        );
        for m in &d.migrations {
            let r = m.resources.clone().unwrap_or_default();
            println!(
                "       migrates {}-{} to {}m CPU, {} MiB ({})",
                m.role,
                m.index,
                r.cpu_millicores,
                r.memory_bytes >> 20,
                m.reason
            );
        }
        for t in &d.role_targets {
            println!("       resizes role {} to {}", t.role, t.count);
        }
        for why in &d.reasons {
            println!("       - {why}");
        }
    }
    Ok(())
}
