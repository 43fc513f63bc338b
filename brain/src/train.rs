//! `brainctl train`: job-profile models fitted on history and scored against the baselines.
//!
//! Histories ([`optimizer::profile::ProfileSample`]s) come from three places:
//! * the brain's own database: each finished job, its scenario its kind and workload, what it
//!   was given per worker (the request) and the most one of its processes used (CPU, memory);
//! * Alibaba's GPU trace of 2023 (`openb_pod_list_default.csv`): each pod's CPU, memory and GPU
//!   request, in creation order, scenario its QoS class and accepted GPU models. Only requests
//!   are published, so a pod's request is what it "needs": the user's-request baseline is
//!   perfect by construction there and is left out;
//! * Alibaba's DLRM serving trace of 2025: each instance's CPU, memory and GPU request,
//!   scenario its service and role (CPU node or GPU node, the PS/worker analogue); instances
//!   created before the trace's window count as its oldest. Limits would stand in for the
//!   user's request (what the owner allowed), but they equal the requests throughout, so the
//!   user's-request baseline is left out there too.
//!
//! Last in every table comes [`ScenarioBound`], which peeks at the scored jobs: the least
//! over-provisioning any predictor that knows only a job's scenario could reach.

use std::path::Path;

use optimizer::profile::{
    Demand, DlRoverRule, Evaluation, GlobalMedian, LearnedModel, Predictor, ProfileSample,
    ScenarioBound, UserRequest, evaluate, split,
};

use crate::BrainError;
use crate::store::{JobRow, JobState};

/// A history `brainctl train --evaluate` can score.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HistoryKind {
    /// The brain's own finished jobs (scored once there are 40; the model itself is fitted
    /// from 20).
    Own,
    /// Alibaba's GPU trace of 2023: pods' CPU, memory and GPU.
    #[value(name = "alibaba-2023")]
    Alibaba2023,
    /// Alibaba's DLRM trace of 2025: CPU-node and GPU-node roles.
    #[value(name = "alibaba-2025")]
    Alibaba2025,
}

/// The name the brain stores its fitted job-profile model under.
pub const MODEL_NAME: &str = "job_profile";

/// One history and how every predictor did on it.
pub struct Scored {
    pub dataset: String,
    pub jobs: usize,
    pub train: usize,
    pub results: Vec<Evaluation>,
    /// Why a baseline was left out, for the reader of the table.
    pub notes: Vec<String>,
}

/// What makes two of the brain's jobs alike: their kind and workload.
pub fn scenario(spec: &vocab::JobSpec) -> String {
    format!(
        "{}|{}",
        spec.kind,
        serde_json::to_string(&spec.workload).expect("plain struct")
    )
}

fn scenario_of(row: &JobRow) -> Option<String> {
    let spec: vocab::JobSpec = serde_norway::from_str(row.spec.as_deref()?).ok()?;
    Some(scenario(&spec))
}

/// The brain's finished jobs as a history.
pub fn from_store(rows: &[JobRow]) -> Vec<ProfileSample> {
    rows.iter()
        .filter(|r| r.state == JobState::Succeeded && r.peak_process_memory_bytes > 0)
        .filter_map(|r| {
            let shape = r.shape.as_ref()?;
            let t = shape.training_group();
            Some(ProfileSample {
                at_s: r.registered_unix_ms as f64 / 1000.0,
                scenario: scenario_of(r).unwrap_or_else(|| shape.kind.to_string()),
                family: shape.kind.to_string(),
                requested: Some(Demand([
                    t.millicores as f64,
                    (t.memory_bytes >> 20) as f64,
                    t.gpus.as_f64(),
                ])),
                used: Demand([
                    r.peak_process_millicores as f64,
                    (r.peak_process_memory_bytes as f64 / 1048576.0).ceil(),
                    t.gpus.as_f64(),
                ]),
            })
        })
        .collect()
}

pub fn alibaba_2023(path: &Path) -> Result<Vec<ProfileSample>, BrainError> {
    Ok(datasets::alibaba::read_pods(path)?
        .into_iter()
        .map(|p| {
            let gpu = p.num_gpu as f64 * p.gpu_milli as f64 / 1000.0;
            let d = Demand([p.cpu_milli as f64, p.memory_mib as f64, gpu]);
            ProfileSample {
                at_s: p.creation_s as f64,
                scenario: format!("{}|{}", p.qos, p.gpu_models.join("|")),
                family: p.qos.clone(),
                // Only requests are published: the request is the need.
                requested: Some(d),
                used: d,
            }
        })
        .collect())
}

pub fn alibaba_2025(path: &Path) -> Result<Vec<ProfileSample>, BrainError> {
    Ok(datasets::alibaba::read_dlrm(path)?
        .into_iter()
        .map(|x| ProfileSample {
            at_s: x.creation_s.unwrap_or(-1.0),
            scenario: format!("{}|{}", x.app, x.role),
            family: x.role.clone(),
            requested: Some(Demand([
                x.cpu_limit * 1000.0,
                x.memory_limit_gib * 1024.0,
                x.gpu_request,
            ])),
            used: Demand([
                x.cpu_request * 1000.0,
                x.memory_request_gib * 1024.0,
                x.gpu_request,
            ]),
        })
        .collect())
}

/// Splits `samples` by time, fits ours on the earlier part and scores all on the later part.
pub fn score(
    dataset: &str,
    mut samples: Vec<ProfileSample>,
    train_share: f64,
    quantile: f64,
) -> Result<Scored, BrainError> {
    let jobs = samples.len();
    // A request that always equals the need is the answer, not a baseline.
    let requests_differ = samples
        .iter()
        .any(|s| s.requested.is_some_and(|r| r != s.used));
    let has_requests = samples.iter().all(|s| s.requested.is_some());
    let mut notes = Vec::new();
    if has_requests && !requests_differ {
        // Nobody may see them: a predictor reading the request would read the answer.
        for s in &mut samples {
            s.requested = None;
        }
    }
    let (train, test) = split(samples, train_share);
    let ours = LearnedModel::fit(&train, quantile)
        .map_err(|e| BrainError::Internal(format!("{dataset}: fitting the model: {e}")))?;
    let dlrover = DlRoverRule::default();
    let median = GlobalMedian::default();
    let request = UserRequest::default();
    let mut predictors: Vec<&dyn Predictor> = vec![&ours, &dlrover, &median];
    if !has_requests {
        notes.push("user request: left out, the history does not say what users asked for".into());
    } else if !requests_differ {
        notes.push(
            "user request: left out, every request equals the need (perfect by construction); \
             no predictor is shown the requests"
                .into(),
        );
    } else {
        predictors.push(&request);
    }
    // Last, and marked as peeking: the best a scenario-only predictor could do at `quantile`.
    let bound = ScenarioBound::new(&test, quantile);
    predictors.push(&bound);
    Ok(Scored {
        dataset: dataset.to_string(),
        jobs,
        train: train.len(),
        results: evaluate(&train, &test, &predictors),
        notes,
    })
}

/// The table `brainctl train --evaluate` prints for one history.
pub fn render(s: &Scored) -> String {
    let mut out = format!(
        "{}: {} jobs, fitted on the first {}, scored on the last {} (each from all jobs before it)\n",
        s.dataset,
        s.jobs,
        s.train,
        s.jobs - s.train
    );
    out += &format!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}\n",
        "predictor",
        "over cpu",
        "over mem",
        "over gpu",
        "under cpu",
        "under mem",
        "under gpu",
        "under any",
        "err mem"
    );
    let pct = |x: f64| format!("{:.1}%", x * 100.0);
    for e in &s.results {
        out += &format!(
            "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}\n",
            e.predictor,
            pct(e.over[0]),
            pct(e.over[1]),
            pct(e.over[2]),
            pct(e.under[0]),
            pct(e.under[1]),
            pct(e.under[2]),
            pct(e.under_any),
            pct(e.relative_error[1])
        );
    }
    for n in &s.notes {
        out += &format!("  {n}\n");
    }
    out
}
