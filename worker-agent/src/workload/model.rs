//! Logistic regression over hashed sparse features with Adagrad, in the two layouts the built-in
//! workload uses: a sparse table (a parameter server's partition, keys created on first touch)
//! and a dense vector (every allreduce worker's replica). Both save to a small binary format
//! whose parameter section has a SHA-256 digest, so two states can be compared bit for bit.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use super::ctr::{BIAS_KEY, CtrGenerator, Sample, log_loss, sigmoid};
use sha2::{Digest, Sha256};

use crate::error::Error;

const EPS: f32 = 1e-7;

/// One Adagrad step on a weight and its accumulator.
pub fn adagrad(w: &mut f32, acc: &mut f32, g: f32, lr: f32) {
    *acc += g * g;
    *w -= lr * g / (acc.sqrt() + EPS);
}

/// Prediction for a sample's keys under `weight`.
pub fn predict(keys: &[u64], weight: impl Fn(u64) -> f32) -> f64 {
    sigmoid(keys.iter().map(|&k| weight(k) as f64).sum())
}

/// Summed gradients per key over `samples` and the summed log-loss.
pub fn batch_gradient(samples: &[Sample], weight: impl Fn(u64) -> f32) -> (HashMap<u64, f32>, f64) {
    let mut grads: HashMap<u64, f32> = HashMap::new();
    let mut loss = 0.0;
    for s in samples {
        let p = predict(&s.keys, &weight);
        loss += log_loss(p, s.label);
        let g = (p - s.label as f64) as f32;
        for &k in &s.keys {
            *grads.entry(k).or_insert(0.0) += g;
        }
    }
    (grads, loss)
}

/// Mean log-loss over samples `range` of `data` under `weight`.
pub fn eval_loss(
    data: &CtrGenerator,
    range: std::ops::Range<u64>,
    weight: impl Fn(u64) -> f32,
) -> f64 {
    let n = (range.end - range.start).max(1) as f64;
    range
        .map(|i| {
            let s = data.sample(i);
            log_loss(predict(&s.keys, &weight), s.label)
        })
        .sum::<f64>()
        / n
}

/// Sum of the sample indices `start..start+n`, modulo 2^64: a checksum of which samples were
/// applied, exact for any real data set, and defined (not a panic) for any request a peer sends.
pub fn index_sum(start: u64, n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        let (start, n) = (u128::from(start), u128::from(n));
        (n * start + n * (n - 1) / 2) as u64
    }
}

/// Little-endian binary writer for checkpoint files.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32s(&mut self, v: &[f32]) {
        self.0.extend_from_slice(bytemuck::cast_slice(v));
    }
    fn u64s(&mut self, v: &[u64]) {
        self.0.extend_from_slice(bytemuck::cast_slice(v));
    }
}

struct In<'a> {
    data: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| Error::Checkpoint {
                path: self.path.to_path_buf(),
                problem: format!(
                    "truncated at byte {} (wanted {n} more of {})",
                    self.at,
                    self.data.len()
                ),
            })?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, Error> {
        Ok(bytemuck::pod_collect_to_vec(self.take(n * 4)?))
    }
    fn u64s(&mut self, n: usize) -> Result<Vec<u64>, Error> {
        Ok(bytemuck::pod_collect_to_vec(self.take(n * 8)?))
    }
}

fn read(path: &Path, magic: &[u8; 4]) -> Result<Vec<u8>, Error> {
    let data = std::fs::read(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    if data.get(..4) != Some(magic) {
        return Err(Error::Checkpoint {
            path: path.to_path_buf(),
            problem: format!("not a {} file", String::from_utf8_lossy(magic)),
        });
    }
    Ok(data)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// The PS that owns `key` among `num_ps`: jump consistent hashing (Lamping & Veach) of the
/// key's hash, so going from P to P' servers moves only the keys whose owner must change
/// (growing moves keys only to the new servers; shrinking only from the removed ones).
pub fn ps_owner(key: u64, num_ps: u32) -> u32 {
    jump_consistent_hash::hash(
        xxhash_rust::xxh3::xxh3_64(&key.to_le_bytes()),
        num_ps.max(1) as usize,
    )
}

/// Order-independent digest of one (key, weight, accumulator) triple: the wrapping sum over a
/// set of triples is the same however the set is split over parameter servers.
pub fn param_digest(key: u64, p: [f32; 2]) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&key.to_le_bytes());
    b[8..12].copy_from_slice(&p[0].to_bits().to_le_bytes());
    b[12..].copy_from_slice(&p[1].to_bits().to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&b)
}

/// A parameter server's partition: weight and Adagrad accumulator per key, plus the set of
/// batches already applied, so a batch pushed twice (a worker died after pushing part of a
/// shard, and the shard was handed out again) is applied once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SparseTable {
    pub params: HashMap<u64, [f32; 2]>,
    pub applied: BTreeSet<(u32, u64)>,
    pub applied_samples: u64,
    pub applied_index_sum: u64,
    pub duplicate_pushes: u64,
}

impl SparseTable {
    pub fn weight(&self, key: u64) -> f32 {
        self.params.get(&key).map(|p| p[0]).unwrap_or(0.0)
    }

    /// Applies the batch `(epoch, batch_start)` of `samples` samples once. Returns false for a
    /// duplicate.
    pub fn push(
        &mut self,
        keys: &[u64],
        grads: &[f32],
        epoch: u32,
        batch_start: u64,
        samples: u32,
        lr: f32,
    ) -> bool {
        if !self.applied.insert((epoch, batch_start)) {
            self.duplicate_pushes += 1;
            return false;
        }
        for (&k, &g) in keys.iter().zip(grads) {
            let p = self.params.entry(k).or_insert([0.0, 0.0]);
            let [mut w, mut acc] = *p;
            adagrad(&mut w, &mut acc, g, lr);
            *p = [w, acc];
        }
        self.applied_samples += samples as u64;
        self.applied_index_sum = self
            .applied_index_sum
            .wrapping_add(index_sum(batch_start, samples as u64));
        true
    }

    fn sorted(&self) -> (Vec<u64>, Vec<f32>, Vec<f32>) {
        let mut keys: Vec<u64> = self.params.keys().copied().collect();
        keys.sort_unstable();
        let w = keys.iter().map(|k| self.params[k][0]).collect();
        let a = keys.iter().map(|k| self.params[k][1]).collect();
        (keys, w, a)
    }

    /// [`param_digest`] summed over the keys `owned` accepts.
    pub fn owned_digest(&self, owned: impl Fn(u64) -> bool) -> u64 {
        self.params
            .iter()
            .filter(|(k, _)| owned(**k))
            .fold(0u64, |acc, (k, p)| acc.wrapping_add(param_digest(*k, *p)))
    }

    /// SHA-256 over the sorted keys, weights and accumulators.
    pub fn digest(&self) -> String {
        let (k, w, a) = self.sorted();
        let mut h = Sha256::new();
        h.update(bytemuck::cast_slice(&k));
        h.update(bytemuck::cast_slice(&w));
        h.update(bytemuck::cast_slice(&a));
        hex::encode(h.finalize())
    }

    /// The partition as its checkpoint file holds it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (k, w, a) = self.sorted();
        let mut o = Out::default();
        o.0.extend_from_slice(b"BRPS");
        o.u64(k.len() as u64);
        o.u64s(&k);
        o.f32s(&w);
        o.f32s(&a);
        o.u64(self.applied.len() as u64);
        for &(e, s) in &self.applied {
            o.u32(e);
            o.u64(s);
        }
        o.u64(self.applied_samples);
        o.u64(self.applied_index_sum);
        o.u64(self.duplicate_pushes);
        o.0
    }

    pub fn save(&self, path: &Path) -> Result<String, Error> {
        write(path, &self.to_bytes())?;
        Ok(self.digest())
    }

    pub fn load(path: &Path, expected_digest: Option<&str>) -> Result<Self, Error> {
        let data = read(path, b"BRPS")?;
        let t = Self::from_bytes(&data, path)?;
        check_digest(path, expected_digest, &t.digest())?;
        Ok(t)
    }

    /// The partition of a flash checkpoint's part (`path`), whose digest is the SHA-256 of its
    /// bytes, as the agent that wrote it out computed it.
    pub fn load_part(path: &Path, file_digest: &str) -> Result<Self, Error> {
        let data = read(path, b"BRPS")?;
        check_digest(path, Some(file_digest), &hex::encode(Sha256::digest(&data)))?;
        Self::from_bytes(&data, path)
    }

    /// The partition `data` (a checkpoint file's bytes, read from `path`) holds.
    pub fn from_bytes(data: &[u8], path: &Path) -> Result<Self, Error> {
        if data.get(..4) != Some(b"BRPS") {
            return Err(Error::Checkpoint {
                path: path.to_path_buf(),
                problem: "not a BRPS file".into(),
            });
        }
        let mut i = In { data, at: 4, path };
        let n = i.u64()? as usize;
        let k = i.u64s(n)?;
        let w = i.f32s(n)?;
        let a = i.f32s(n)?;
        let m = i.u64()? as usize;
        let mut applied = BTreeSet::new();
        for _ in 0..m {
            let e = i.u32()?;
            applied.insert((e, i.u64()?));
        }
        Ok(SparseTable {
            params: k
                .into_iter()
                .zip(w.into_iter().zip(a))
                .map(|(k, (w, a))| (k, [w, a]))
                .collect(),
            applied,
            applied_samples: i.u64()?,
            applied_index_sum: i.u64()?,
            duplicate_pushes: i.u64()?,
        })
    }
}

fn check_digest(path: &Path, expected: Option<&str>, got: &str) -> Result<(), Error> {
    match expected {
        Some(e) if e != got => Err(Error::Checkpoint {
            path: path.to_path_buf(),
            problem: format!("digest {got} does not match the manifest's {e}"),
        }),
        _ => Ok(()),
    }
}

/// The replicated model of an allreduce job: `buckets` weights plus the bias, with Adagrad
/// state, and the counters that prove which samples it has seen.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseModel {
    pub buckets: u64,
    pub weights: Vec<f32>,
    pub acc: Vec<f32>,
    pub step: u64,
    pub applied_samples: u64,
    pub applied_index_sum: u64,
}

impl DenseModel {
    pub fn new(buckets: u64) -> Self {
        Self {
            buckets,
            weights: vec![0.0; buckets as usize + 1],
            acc: vec![0.0; buckets as usize + 1],
            step: 0,
            applied_samples: 0,
            applied_index_sum: 0,
        }
    }

    pub fn slot(&self, key: u64) -> usize {
        if key == BIAS_KEY {
            self.buckets as usize
        } else {
            key as usize
        }
    }

    pub fn weight(&self, key: u64) -> f32 {
        self.weights[self.slot(key)]
    }

    /// Adds the summed gradient of `samples` into `grad` (dense) and returns the summed loss.
    pub fn accumulate(&self, samples: &[Sample], grad: &mut [f32]) -> f64 {
        let mut loss = 0.0;
        for s in samples {
            let p = predict(&s.keys, |k| self.weight(k));
            loss += log_loss(p, s.label);
            let g = (p - s.label as f64) as f32;
            for &k in &s.keys {
                grad[self.slot(k)] += g;
            }
        }
        loss
    }

    /// Applies the mean gradient `grad_sum / count` to every touched weight.
    pub fn apply(&mut self, grad_sum: &[f32], count: u64, lr: f32) {
        let inv = 1.0 / count as f32;
        for ((w, acc), &g) in self
            .weights
            .iter_mut()
            .zip(self.acc.iter_mut())
            .zip(grad_sum)
        {
            if g != 0.0 {
                adagrad(w, acc, g * inv, lr);
            }
        }
        self.step += 1;
    }

    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(bytemuck::cast_slice(&self.weights));
        h.update(bytemuck::cast_slice(&self.acc));
        hex::encode(h.finalize())
    }

    /// The model as its checkpoint file holds it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut o = Out::default();
        o.0.extend_from_slice(b"BRAR");
        o.u64(self.buckets);
        o.f32s(&self.weights);
        o.f32s(&self.acc);
        o.u64(self.step);
        o.u64(self.applied_samples);
        o.u64(self.applied_index_sum);
        o.0
    }

    /// The length of `to_bytes()` for a model of `buckets`.
    pub fn bytes_len(buckets: u64) -> usize {
        4 + 8 + 2 * 4 * (buckets as usize + 1) + 3 * 8
    }

    pub fn save(&self, path: &Path) -> Result<String, Error> {
        write(path, &self.to_bytes())?;
        Ok(self.digest())
    }

    pub fn load(path: &Path, expected_digest: Option<&str>) -> Result<Self, Error> {
        let data = read(path, b"BRAR")?;
        let m = Self::from_bytes(&data, path)?;
        check_digest(path, expected_digest, &m.digest())?;
        Ok(m)
    }

    /// The model of a flash checkpoint's part (`path`), whose digest is the SHA-256 of its
    /// bytes, as the agent that wrote it out computed it.
    pub fn load_part(path: &Path, file_digest: &str) -> Result<Self, Error> {
        let data = read(path, b"BRAR")?;
        check_digest(path, Some(file_digest), &hex::encode(Sha256::digest(&data)))?;
        Self::from_bytes(&data, path)
    }

    /// The model `data` (a checkpoint file's bytes, read from `path`) holds.
    pub fn from_bytes(data: &[u8], path: &Path) -> Result<Self, Error> {
        if data.get(..4) != Some(b"BRAR") {
            return Err(Error::Checkpoint {
                path: path.to_path_buf(),
                problem: "not a BRAR file".into(),
            });
        }
        let mut i = In { data, at: 4, path };
        let buckets = i.u64()?;
        let n = buckets as usize + 1;
        Ok(DenseModel {
            buckets,
            weights: i.f32s(n)?,
            acc: i.f32s(n)?,
            step: i.u64()?,
            applied_samples: i.u64()?,
            applied_index_sum: i.u64()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_table_applies_a_batch_once_and_round_trips() {
        let mut t = SparseTable::default();
        assert!(t.push(&[1, 2], &[0.5, -0.5], 0, 0, 4, 0.1));
        assert!(!t.push(&[1, 2], &[0.5, -0.5], 0, 0, 4, 0.1));
        assert_eq!(
            (t.applied_samples, t.applied_index_sum, t.duplicate_pushes),
            (4, 6, 1)
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ps.bin");
        let d = t.save(&p).unwrap();
        assert_eq!(SparseTable::load(&p, Some(&d)).unwrap(), t);
        assert!(SparseTable::load(&p, Some("00")).is_err());
        std::fs::write(&p, b"BRPS\x01").unwrap();
        assert!(SparseTable::load(&p, None).is_err());
        // A flash part: the file's bytes, checked by their SHA-256.
        std::fs::write(&p, t.to_bytes()).unwrap();
        let file = hex::encode(Sha256::digest(t.to_bytes()));
        assert_eq!(SparseTable::load_part(&p, &file).unwrap(), t);
        assert!(
            SparseTable::load_part(&p, &d).is_err(),
            "not the file's digest"
        );
    }

    #[test]
    fn dense_model_round_trips_bit_for_bit() {
        let mut m = DenseModel::new(8);
        let mut g = vec![0.0; 9];
        g[3] = 1.0;
        g[8] = -2.0;
        m.apply(&g, 2, 0.1);
        m.applied_samples = 2;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.bin");
        let d = m.save(&p).unwrap();
        assert_eq!(DenseModel::load(&p, Some(&d)).unwrap(), m);
        assert_eq!(m.to_bytes().len(), DenseModel::bytes_len(8));
    }

    #[test]
    fn index_sum_is_the_arithmetic_series() {
        assert_eq!(index_sum(10, 3), 33);
        assert_eq!(index_sum(5, 0), 0);
        // A request with absurd numbers (a fuzzer's) gets a checksum, not a panic.
        assert_eq!(
            index_sum(u64::MAX, 2),
            u64::MAX.wrapping_mul(2).wrapping_add(1)
        );
    }
}
