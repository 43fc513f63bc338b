//! The same training in one process, no network: the yardstick the distributed runs are judged
//! against. Shards are taken in order and each step applies one global batch (as the allreduce
//! job does with a world of one), so the synchronous job differs from this only in sample order.

use proto::jobmaster::v1 as pb;

use super::generator;
use super::model::{DenseModel, SparseTable, batch_gradient, eval_loss};
use crate::error::Error;

/// Samples of every step: global batches cut at shard boundaries, in order, for every epoch.
fn batches(
    cfg: &pb::WorkloadConfig,
    shard_size: u64,
) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
    let b = cfg.batch_size.max(1) as u64;
    let n = cfg.num_samples;
    (0..cfg.epochs).flat_map(move |epoch| {
        (0..n.div_ceil(shard_size)).flat_map(move |s| {
            let (start, end) = (s * shard_size, ((s + 1) * shard_size).min(n));
            (start..end)
                .step_by(b as usize)
                .map(move |at| (epoch, at, b.min(end - at)))
        })
    })
}

/// Synchronous SGD on a dense replica (what an allreduce job computes). Returns the held-out
/// log-loss and the model.
pub fn train_dense(cfg: &pb::WorkloadConfig, shard_size: u64) -> Result<(f64, DenseModel), Error> {
    let data = generator(cfg)?;
    let mut model = DenseModel::new(cfg.hash_buckets);
    let mut grad = vec![0.0f32; model.weights.len()];
    for (_, at, n) in batches(cfg, shard_size) {
        let samples: Vec<_> = (at..at + n).map(|i| data.sample(i)).collect();
        model.accumulate(&samples, &mut grad);
        model.apply(&grad, n, cfg.learning_rate);
        model.applied_samples += n;
        grad.iter_mut().for_each(|g| *g = 0.0);
    }
    let loss = eval_loss(
        &data,
        cfg.num_samples..cfg.num_samples + cfg.eval_samples,
        |k| model.weight(k),
    );
    Ok((loss, model))
}

/// SGD on a sparse table (what a ps job computes with one worker and no staleness).
pub fn train_sparse(
    cfg: &pb::WorkloadConfig,
    shard_size: u64,
) -> Result<(f64, SparseTable), Error> {
    let data = generator(cfg)?;
    let mut table = SparseTable::default();
    for (epoch, at, n) in batches(cfg, shard_size) {
        let samples: Vec<_> = (at..at + n).map(|i| data.sample(i)).collect();
        let (grads, _) = batch_gradient(&samples, |k| table.weight(k));
        let mut grads: Vec<(u64, f32)> =
            grads.into_iter().map(|(k, g)| (k, g / n as f32)).collect();
        grads.sort_unstable_by_key(|(k, _)| *k);
        let (keys, g): (Vec<u64>, Vec<f32>) = grads.into_iter().unzip();
        table.push(&keys, &g, epoch, at, n as u32, cfg.learning_rate);
    }
    let loss = eval_loss(
        &data,
        cfg.num_samples..cfg.num_samples + cfg.eval_samples,
        |k| table.weight(k),
    );
    Ok((loss, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> pb::WorkloadConfig {
        pb::WorkloadConfig {
            kind: "allreduce".into(),
            seed: 3,
            num_samples: 20_000,
            eval_samples: 5_000,
            num_fields: 6,
            vocab_per_field: 200,
            hash_buckets: 1 << 14,
            batch_size: 128,
            learning_rate: 0.1,
            epochs: 2,
            ..Default::default()
        }
    }

    #[test]
    fn training_beats_the_constant_predictor_and_approaches_the_bayes_floor() {
        let c = cfg();
        let data = generator(&c).unwrap();
        let range = c.num_samples..c.num_samples + c.eval_samples;
        let bayes = data.bayes_log_loss(range.clone());
        let untrained = eval_loss(&data, range, |_| 0.0);
        let (dense, m) = train_dense(&c, 1000).unwrap();
        let (sparse, _) = train_sparse(&c, 1000).unwrap();
        assert_eq!(m.applied_samples, 40_000);
        assert!(
            dense < untrained * 0.9,
            "dense {dense} untrained {untrained}"
        );
        assert!(dense < bayes * 1.15, "dense {dense} bayes {bayes}");
        // Same data, same batches, same optimiser: the layouts agree closely.
        assert!(
            (dense - sparse).abs() / dense < 0.01,
            "dense {dense} sparse {sparse}"
        );
    }
}
