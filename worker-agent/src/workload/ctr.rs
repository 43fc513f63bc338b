//! A synthetic CTR data set with a known logistic ground truth.
//!
//! A sample has `num_fields` categorical fields. Field values follow a skewed (power-law-like)
//! distribution over `vocab_per_field` values, as ids in real click logs do. Each
//! `(field, value)` pair has a ground-truth weight drawn from a normal distribution, and the
//! label is Bernoulli(sigmoid(bias + sum of weights)). Features are hashed into `hash_buckets`
//! keys, the form a parameter server partitions by key. The bias is the reserved key
//! [`BIAS_KEY`], present in every sample.
//!
//! Samples `0..num_samples` are the training set; samples from `num_samples` on are the
//! held-out evaluation set, so the two never overlap.

use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The key every sample carries for the model's bias term.
pub const BIAS_KEY: u64 = u64::MAX;

/// Ground-truth bias: about 27 % positives, a typical click-through rate for a ranked feed.
const TRUE_BIAS: f64 = -1.0;
/// Standard deviation of the ground-truth weights.
const TRUE_WEIGHT_STD: f64 = 0.8;

/// Shape of a generated data set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CtrSpec {
    pub seed: u64,
    pub num_fields: u32,
    pub vocab_per_field: u64,
    pub hash_buckets: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CtrSpecError {
    #[error("num_fields must be at least 1, got {0}")]
    NoFields(u32),
    #[error("vocab_per_field must be at least 1, got {0}")]
    NoVocab(u64),
    #[error("hash_buckets must be at least 1, got {0}")]
    NoBuckets(u64),
}

impl CtrSpec {
    pub fn validate(&self) -> Result<(), CtrSpecError> {
        if self.num_fields == 0 {
            return Err(CtrSpecError::NoFields(self.num_fields));
        }
        if self.vocab_per_field == 0 {
            return Err(CtrSpecError::NoVocab(self.vocab_per_field));
        }
        if self.hash_buckets == 0 {
            return Err(CtrSpecError::NoBuckets(self.hash_buckets));
        }
        Ok(())
    }
}

/// One sample: its hashed feature keys (bias first) and its 0/1 label.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub keys: Vec<u64>,
    pub label: f32,
}

/// Produces samples by index. Cheap to clone and to share between threads.
#[derive(Clone, Debug)]
pub struct CtrGenerator {
    spec: CtrSpec,
}

impl CtrGenerator {
    pub fn new(spec: CtrSpec) -> Result<Self, CtrSpecError> {
        spec.validate()?;
        Ok(Self { spec })
    }

    pub fn spec(&self) -> &CtrSpec {
        &self.spec
    }

    /// The categorical value of every field of sample `index`, and the uniform draw that decides
    /// its label. Everything else derives from these.
    fn draw(&self, index: u64) -> (Vec<u64>, f64) {
        let mut rng =
            Pcg64Mcg::seed_from_u64(xxh3_64_with_seed(&index.to_le_bytes(), self.spec.seed));
        let values = (0..self.spec.num_fields)
            .map(|_| {
                // u^3 puts most mass on small ids: a few very frequent values, a long tail.
                let u: f64 = rng.random();
                ((u * u * u) * self.spec.vocab_per_field as f64) as u64 % self.spec.vocab_per_field
            })
            .collect();
        (values, rng.random())
    }

    /// The hashed key of `(field, value)`.
    pub fn key(&self, field: u32, value: u64) -> u64 {
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&field.to_le_bytes());
        bytes[4..].copy_from_slice(&value.to_le_bytes());
        xxh3_64_with_seed(&bytes, self.spec.seed ^ 0x9e37_79b9_7f4a_7c15) % self.spec.hash_buckets
    }

    /// Ground-truth weight of `(field, value)`: normal(0, TRUE_WEIGHT_STD) by Box–Muller on a hash.
    pub fn true_weight(&self, field: u32, value: u64) -> f64 {
        let mut bytes = [0u8; 12];
        bytes[..4].copy_from_slice(&field.to_le_bytes());
        bytes[4..].copy_from_slice(&value.to_le_bytes());
        let mut rng = Pcg64Mcg::seed_from_u64(xxh3_64_with_seed(
            &bytes,
            self.spec.seed ^ 0x5851_f42d_4c95_7f2d,
        ));
        let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = rng.random();
        TRUE_WEIGHT_STD * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// The probability of a click under the ground truth for sample `index`.
    pub fn true_probability(&self, index: u64) -> f64 {
        let (values, _) = self.draw(index);
        self.logit_of(&values)
    }

    fn logit_of(&self, values: &[u64]) -> f64 {
        let logit = TRUE_BIAS
            + values
                .iter()
                .enumerate()
                .map(|(f, &v)| self.true_weight(f as u32, v))
                .sum::<f64>();
        sigmoid(logit)
    }

    /// Sample `index`: keys (bias first, then one per field) and label.
    pub fn sample(&self, index: u64) -> Sample {
        let (values, u) = self.draw(index);
        let p = self.logit_of(&values);
        let mut keys = Vec::with_capacity(values.len() + 1);
        keys.push(BIAS_KEY);
        keys.extend(
            values
                .iter()
                .enumerate()
                .map(|(f, &v)| self.key(f as u32, v)),
        );
        Sample {
            keys,
            label: if u < p { 1.0 } else { 0.0 },
        }
    }

    /// Mean log-loss of the ground-truth model over samples `range`: the floor any learner can
    /// approach on that range.
    pub fn bayes_log_loss(&self, range: std::ops::Range<u64>) -> f64 {
        let n = range.end.saturating_sub(range.start).max(1) as f64;
        range
            .map(|i| {
                let (values, u) = self.draw(i);
                let p = self.logit_of(&values);
                log_loss(p, if u < p { 1.0 } else { 0.0 })
            })
            .sum::<f64>()
            / n
    }
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Binary cross-entropy of predicting `p` for label `y`, with `p` clamped away from 0 and 1.
pub fn log_loss(p: f64, y: f32) -> f64 {
    let p = p.clamp(1e-7, 1.0 - 1e-7);
    if y > 0.5 { -p.ln() } else { -(1.0 - p).ln() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec() -> CtrSpec {
        CtrSpec {
            seed: 7,
            num_fields: 8,
            vocab_per_field: 1000,
            hash_buckets: 1 << 20,
        }
    }

    #[test]
    fn rejects_empty_shapes() {
        let mut s = spec();
        s.num_fields = 0;
        assert_eq!(CtrGenerator::new(s).unwrap_err(), CtrSpecError::NoFields(0));
        let mut s = spec();
        s.hash_buckets = 0;
        assert_eq!(
            CtrGenerator::new(s).unwrap_err(),
            CtrSpecError::NoBuckets(0)
        );
    }

    #[test]
    fn click_rate_is_realistic_and_bayes_loss_below_constant_predictor() {
        let g = CtrGenerator::new(spec()).unwrap();
        let n = 20_000;
        let ctr = (0..n).map(|i| g.sample(i).label as f64).sum::<f64>() / n as f64;
        assert!((0.15..0.45).contains(&ctr), "click rate {ctr}");
        let constant = (0..n)
            .map(|i| log_loss(ctr, g.sample(i).label))
            .sum::<f64>()
            / n as f64;
        let bayes = g.bayes_log_loss(0..n);
        assert!(
            bayes < constant * 0.9,
            "bayes {bayes} vs constant {constant}"
        );
    }

    proptest! {
        #[test]
        fn samples_are_a_pure_function_of_seed_and_index(i in 0u64..1_000_000) {
            let g = CtrGenerator::new(spec()).unwrap();
            let a = g.sample(i);
            prop_assert_eq!(&a, &g.clone().sample(i));
            prop_assert_eq!(a.keys.len(), 9);
            prop_assert_eq!(a.keys[0], BIAS_KEY);
            prop_assert!(a.keys[1..].iter().all(|&k| k < (1 << 20)));
        }
    }
}
