//! Data for Brain.
//!
//! For now this crate holds [`ctr`], the deterministic click-through-rate data generator that the
//! built-in reference workload trains on: every sample is a pure function of `(seed, index)`, so
//! any process can produce any shard without a file, and the generator knows the ground-truth
//! model, so the log-loss a training run reaches can be judged against the best one possible.
//! Trace and profile parsers (Gavel, Pollux, Sia, Alibaba) join it with the simulator issue.

pub mod ctr;

pub use ctr::{CtrGenerator, CtrSpec, CtrSpecError, Sample, log_loss, sigmoid};
