//! `brainctl trace`: make traces for `brainctl whatif`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;

#[derive(Subcommand)]
pub enum TraceAction {
    /// Draw a Philly-like job list of any size from a real one: whole days of the source are
    /// drawn at random with replacement, each job of a day kept as it was (time of day,
    /// duration, GPUs, virtual cluster), so the arrival rate, the bursts and the mix of sizes
    /// stay the source's. The result is a Philly job list `brainctl whatif --trace` replays.
    PhillyLike {
        /// The Philly job list drawn from (Pollux's `traces/philly.csv`, 82,247 jobs).
        #[arg(long)]
        from: PathBuf,
        /// Jobs to draw.
        #[arg(long, default_value_t = 1_000_000)]
        jobs: usize,
        /// Seed of the draws; the same source and seed give the same trace.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Where to write it (never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
}

/// The most jobs `philly-like` draws.
const MAX_JOBS: usize = 100_000_000;

pub fn trace(action: TraceAction) -> anyhow::Result<()> {
    match action {
        TraceAction::PhillyLike {
            from,
            jobs,
            seed,
            out,
        } => {
            if jobs == 0 || jobs > MAX_JOBS {
                bail!(
                    "--jobs is {jobs}, expected 1 to {MAX_JOBS} (a replay keeps about 0.7 KB a \
                     job: 100 million jobs need about 70 GB)"
                );
            }
            if out.exists() {
                bail!("{} exists; give another --out", out.display());
            }
            let (source, start) = datasets::philly::read_list(&from)?;
            let drawn = datasets::synth::philly_like(&source, jobs, seed)?;
            // Written beside its final name and renamed: an interrupted run leaves no half
            // trace under that name.
            let part = out.with_extension("csv.part");
            if let Err(e) = datasets::synth::write_philly(&part, &drawn, start) {
                let _ = std::fs::remove_file(&part);
                return Err(e.into());
            }
            std::fs::rename(&part, &out)
                .with_context(|| format!("renaming {} to {}", part.display(), out.display()))?;
            let days = drawn.last().map_or(0.0, |j| j.submit_s / 86_400.0).ceil();
            say!(
                "wrote {} jobs over {days} days drawn from {} ({} jobs) to {}",
                drawn.len(),
                from.display(),
                source.len(),
                out.display()
            );
            Ok(())
        }
    }
}
