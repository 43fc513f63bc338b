//! `brainctl train`: the job-profile model fitted on the brain's history, or scored.

use std::path::PathBuf;

use anyhow::{Context, bail};

#[derive(clap::Args)]
pub struct TrainArgs {
    /// Score instead of storing.
    #[arg(long)]
    evaluate: bool,
    /// The brain's database.
    #[arg(long, default_value = "brain-data/brain.db")]
    database: PathBuf,
    /// Folder holding alibaba_gpu_v2023/ and alibaba_gpu_v2025/ (for --evaluate)
    /// [default: the repository's datasets/data, found above this directory, else the
    /// one brainctl was built from].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Share of the jobs (the earliest) the model is fitted on.
    #[arg(long, default_value_t = 0.7)]
    train_share: f64,
    /// Share of jobs the model's margin covers (1 − the under-provisioning it aims at).
    #[arg(long, default_value_t = 0.95)]
    quantile: f64,
    /// Histories to score with --evaluate (repeat for more) [default: all three].
    #[arg(long = "history", value_enum, value_name = "HISTORY")]
    histories: Vec<brain::train::HistoryKind>,
}

pub fn train(args: TrainArgs) -> anyhow::Result<()> {
    let TrainArgs {
        evaluate,
        database,
        data,
        train_share,
        quantile,
        histories,
    } = args;
    if !(0.1..=0.9).contains(&train_share) {
        bail!("--train-share {train_share}: expected 0.1 to 0.9");
    }
    let store = if database.exists() {
        Some(brain::store::Store::open(&database)?)
    } else {
        None
    };
    let own = match &store {
        Some(s) => brain::train::from_store(&s.jobs()?),
        None => Vec::new(),
    };
    if !evaluate {
        let Some(mut store) = store else {
            bail!("no brain database at {}", database.display());
        };
        let model = optimizer::profile::LearnedModel::fit(
            &{
                let mut v = own;
                v.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
                v
            },
            quantile,
        )
        .with_context(|| format!("fitting on the finished jobs of {}", database.display()))?;
        let body = serde_json::to_string(&model)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        store.save_model(brain::train::MODEL_NAME, &body, now)?;
        say!(
            "job-profile model fitted on {} finished jobs, margin for {:.0} % of jobs; stored in {}",
            model.trained_on,
            quantile * 100.0,
            database.display()
        );
        return Ok(());
    }
    use brain::train::HistoryKind;
    let histories = if histories.is_empty() {
        vec![
            HistoryKind::Own,
            HistoryKind::Alibaba2023,
            HistoryKind::Alibaba2025,
        ]
    } else {
        histories
    };
    let data = || -> anyhow::Result<PathBuf> {
        match &data {
            Some(d) => Ok(d.clone()),
            None => std::env::current_dir()?
                .ancestors()
                .map(|a| a.join("datasets/data"))
                .chain([datasets::bundled()])
                .find(|p| p.join("alibaba_gpu_v2023").is_dir())
                .context("no datasets/data with alibaba_gpu_v2023/ above this directory: give --data DIR"),
        }
    };
    let mut own = Some(own);
    for h in histories {
        let (name, samples) = match h {
            HistoryKind::Own => {
                let own = own.take().unwrap_or_default();
                if own.len() < 40 {
                    say!(
                        "own history ({}): {} finished jobs with metrics, too few to score (40 needed)\n",
                        database.display(),
                        own.len()
                    );
                    continue;
                }
                (format!("own history ({})", database.display()), own)
            }
            HistoryKind::Alibaba2023 => {
                let f = data()?.join("alibaba_gpu_v2023/openb_pod_list_default.csv");
                let s = brain::train::alibaba_2023(&f).with_context(|| f.display().to_string())?;
                ("Alibaba GPU 2023 (openb pods)".to_string(), s)
            }
            HistoryKind::Alibaba2025 => {
                let f = data()?.join("alibaba_gpu_v2025/disaggregated_DLRM_trace.csv");
                let s = brain::train::alibaba_2025(&f).with_context(|| f.display().to_string())?;
                ("Alibaba GPU 2025 (DLRM CPU/GPU-node roles)".to_string(), s)
            }
        };
        let s = brain::train::score(&name, samples, train_share, quantile)?;
        say!("{}", brain::train::render(&s));
    }
    Ok(())
}
