//! A worker of a ps job: lease a shard, then per batch pull the weights of the batch's keys from
//! their parameter servers, compute the gradient, push it (asynchronous SGD); report the shard
//! done once every batch of it is pushed. The worker the master picks evaluates the final model
//! on the held-out set. A parameter server that stops answering is waited for rather than
//! reported as this worker's failure: a PS that dies takes the whole group into a restart (the
//! master stops this process then), and a worker that exited first would spend its role's
//! restart budget on a fault that was not its own.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use proto::jobmaster::v1 as pb;

use super::model::{batch_gradient, eval_loss, ps_owner};
use super::ps_server::{PsClient, ps_client};
use super::{MasterLink, ProcessEnv, Progress, generator, simulated_compute};
use crate::error::Error;

/// How long a call to a parameter server that stopped answering is retried: as long as a PS
/// added by a reshard is waited for, time for the master to see the PS' death and restart the
/// group (which stops this process).
const PS_PATIENCE: Duration = Duration::from_secs(60);

/// Clients of every parameter server, in PS index order.
pub struct PsSet {
    clients: Vec<PsClient>,
    addrs: Vec<String>,
    patience: Duration,
}

/// A status that says the PS could not be reached (its connection refused, reset or dropped,
/// or no answer within the call's deadline: a PS stopped or hung), not that it refused the call.
fn cannot_reach(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Cancelled
            | tonic::Code::Unknown
            | tonic::Code::DeadlineExceeded
    )
}

impl PsSet {
    /// Connects to every PS in `addrs` with the job's secret, waiting up to `timeout` in all
    /// for those still starting.
    pub async fn connect(
        addrs: &[String],
        timeout: Duration,
        creds: &auth::JobCreds,
    ) -> Result<Self, Error> {
        let start = Instant::now();
        let mut clients = Vec::new();
        for addr in addrs {
            let left = timeout.saturating_sub(start.elapsed());
            clients.push(ps_client(addr, left, creds).await?);
        }
        Ok(Self {
            clients,
            addrs: addrs.to_vec(),
            patience: PS_PATIENCE,
        })
    }

    /// `call` on PS `i`, again while the PS cannot be reached, for up to `patience`. Retrying
    /// a push is safe: a PS records the batches it applied and applies a batch once.
    async fn retrying<T, F, Fut>(&self, i: usize, mut call: F) -> Result<T, Error>
    where
        F: FnMut(PsClient) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let start = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            match call(self.clients[i].clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if cannot_reach(&s) && start.elapsed() < self.patience => {
                    if pause == Duration::from_millis(50) {
                        tracing::warn!(
                            ps = %self.addrs[i],
                            problem = s.message(),
                            "parameter server unreachable; retrying"
                        );
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(s) => return Err(self.ps_err(i)(s)),
            }
        }
    }

    fn owner(&self, key: u64) -> usize {
        ps_owner(key, self.clients.len() as u32) as usize
    }

    fn ps_err(&self, i: usize) -> impl Fn(tonic::Status) -> Error + '_ {
        move |s| Error::Ps {
            addr: self.addrs[i].clone(),
            problem: s.message().to_string(),
        }
    }

    /// Weights of `keys` (deduplicated) from their owners.
    pub async fn pull(
        &mut self,
        keys: impl IntoIterator<Item = u64>,
    ) -> Result<BTreeMap<u64, f32>, Error> {
        let mut by_ps: Vec<Vec<u64>> = vec![Vec::new(); self.clients.len()];
        for k in keys {
            by_ps[self.owner(k)].push(k);
        }
        let mut out = BTreeMap::new();
        for (i, mut keys) in by_ps.into_iter().enumerate() {
            keys.sort_unstable();
            keys.dedup();
            if keys.is_empty() {
                continue;
            }
            let req = pb::PullRequest { keys: keys.clone() };
            let r = self
                .retrying(i, |mut c| {
                    let req = req.clone();
                    async move { c.pull(req).await }
                })
                .await?;
            out.extend(keys.into_iter().zip(r.values));
        }
        Ok(out)
    }

    /// Pushes the gradients of batch `(epoch, start)` to every PS (an empty push still records
    /// the batch as applied there). Returns how many PS saw it as a duplicate.
    pub async fn push(
        &mut self,
        grads: &BTreeMap<u64, f32>,
        epoch: u32,
        start: u64,
        n: u32,
    ) -> Result<usize, Error> {
        let mut by_ps: Vec<(Vec<u64>, Vec<f32>)> = vec![Default::default(); self.clients.len()];
        for (&k, &g) in grads {
            let (ks, gs) = &mut by_ps[self.owner(k)];
            ks.push(k);
            gs.push(g);
        }
        let mut dups = 0;
        for (i, (keys, grads)) in by_ps.into_iter().enumerate() {
            let req = pb::PushRequest {
                keys,
                grads,
                epoch,
                batch_start: start,
                batch_samples: n,
            };
            let r = self
                .retrying(i, |mut c| {
                    let req = req.clone();
                    async move { c.push(req).await }
                })
                .await?;
            dups += r.duplicate as usize;
        }
        Ok(dups)
    }
}

pub async fn run(env: ProcessEnv) -> Result<(), Error> {
    let mut master = MasterLink::connect(&env).await?;
    let cfg = master.workload().await?;
    let data = generator(&cfg)?;
    let mut ps = PsSet::connect(&env.ps_addrs, Duration::from_secs(60), &env.creds).await?;
    let mut ps_version = env.ps_version;
    let mut progress = Progress::new(0);
    let batch = cfg.batch_size.max(1) as u64;
    loop {
        let lease = master.lease(ps_version, 0).await?;
        if lease.cluster_version != 0 && lease.cluster_version != ps_version {
            // The PS set changed (a reshard or a migrated PS): fetch it and reconnect before
            // pushing again.
            let Some(r) = master.rejoin().await? else {
                tracing::info!("removed by a scale plan");
                return Ok(());
            };
            let cluster = r.cluster.unwrap_or_default();
            ps = PsSet::connect(&cluster.ps, Duration::from_secs(60), &env.creds).await?;
            tracing::info!(
                from = ps_version,
                to = cluster.ps_version,
                ps = cluster.ps.len(),
                "switched to a new PS set"
            );
            ps_version = cluster.ps_version;
            progress.report_next();
            continue;
        }
        match pb::LeaseStatus::try_from(lease.status).unwrap_or(pb::LeaseStatus::Wait) {
            pb::LeaseStatus::Removed => {
                tracing::info!("removed by a scale plan");
                if let Some(m) = progress.due() {
                    master.metrics(m).await?;
                }
                return Ok(());
            }
            pb::LeaseStatus::Granted => {
                let shard = lease.shard.ok_or_else(|| {
                    Error::InvalidRequest("a granted lease without a shard".into())
                })?;
                let mut start = shard.start;
                while start < shard.end {
                    let n = batch.min(shard.end - start);
                    // A ps worker waits for nobody: its whole step is its own work.
                    let computing = Instant::now();
                    let samples: Vec<_> = (start..start + n).map(|i| data.sample(i)).collect();
                    let weights = ps
                        .pull(samples.iter().flat_map(|s| s.keys.iter().copied()))
                        .await?;
                    let (mut grads, loss) =
                        batch_gradient(&samples, |k| weights.get(&k).copied().unwrap_or(0.0));
                    for g in grads.values_mut() {
                        *g /= n as f32;
                    }
                    let grads: BTreeMap<u64, f32> = grads.into_iter().collect();
                    simulated_compute(&cfg, n).await;
                    ps.push(&grads, shard.epoch, start, n as u32).await?;
                    progress.record(n, loss);
                    if n == batch {
                        progress.computed(computing.elapsed());
                    }
                    if let Some(m) = progress.due() {
                        master.metrics(m).await?;
                    }
                    start += n;
                }
                master.done(&shard).await?;
            }
            pb::LeaseStatus::Wait => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => {
                if lease.evaluate {
                    let range = cfg.num_samples..cfg.num_samples + cfg.eval_samples;
                    let mut loss_sum = 0.0;
                    let chunk = 4096;
                    let mut at = range.start;
                    while at < range.end {
                        let end = (at + chunk).min(range.end);
                        let keys: Vec<u64> = (at..end).flat_map(|i| data.sample(i).keys).collect();
                        let w = ps.pull(keys).await?;
                        loss_sum +=
                            eval_loss(&data, at..end, |k| w.get(&k).copied().unwrap_or(0.0))
                                * (end - at) as f64;
                        at = end;
                    }
                    let loss = loss_sum / (range.end - range.start).max(1) as f64;
                    tracing::info!(loss, "final held-out log-loss");
                    let mut m = progress.due().unwrap_or_default();
                    m.global_step = progress.step;
                    m.samples_total = progress.samples;
                    m.loss = progress.loss_ema.unwrap_or(0.0);
                    m.final_eval_loss = Some(loss);
                    master.metrics(m).await?;
                } else if let Some(m) = progress.due() {
                    master.metrics(m).await?;
                }
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::model::SparseTable;
    use crate::workload::ps_server::{PsService, serve};

    fn creds() -> auth::JobCreds {
        auth::JobCreds {
            token: auth::Token::generate(),
            tls: None,
        }
    }

    /// Serves a PS on `listener` holding weight 0 for every key, until its task is aborted.
    async fn serve_ps(listener: tokio::net::TcpListener, creds: auth::JobCreds) {
        let svc = PsService::new(0, 1, 0.1, SparseTable::default(), creds);
        serve(svc, listener, std::future::pending()).await.unwrap();
    }

    #[tokio::test]
    async fn a_ps_that_goes_away_is_waited_for_and_one_that_stays_away_is_reported() {
        let creds = creds();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let first = tokio::spawn(serve_ps(listener, creds.clone()));
        let mut ps = PsSet::connect(std::slice::from_ref(&addr), Duration::from_secs(10), &creds)
            .await
            .unwrap();
        let grads = BTreeMap::from([(7, 1.0)]);
        assert_eq!(ps.push(&grads, 0, 0, 4).await.unwrap(), 0);

        // Killed: its connections drop. Another starts at the same address 400 ms later.
        first.abort();
        let _ = first.await;
        let again = addr.clone();
        let second_creds = creds.clone();
        let second = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let listener = tokio::net::TcpListener::bind(&again).await.unwrap();
            serve_ps(listener, second_creds).await;
        });
        let pushed = Instant::now();
        // The new PS has never seen the batch: it applies it.
        assert_eq!(ps.push(&grads, 0, 0, 4).await.unwrap(), 0);
        assert!(pushed.elapsed() >= Duration::from_millis(300));
        let w = ps.pull([7]).await.unwrap();
        assert!(w[&7] < 0.0, "{w:?}");
        // The same batch again is a duplicate there.
        assert_eq!(ps.push(&grads, 0, 0, 4).await.unwrap(), 1);

        // Gone for good: after the patience, the call fails naming the PS.
        second.abort();
        let _ = second.await;
        ps.patience = Duration::from_millis(300);
        let err = ps.pull([7]).await.unwrap_err().to_string();
        assert!(err.contains(&addr), "{err}");
    }
}
