//! What a job spec may ask for at most, and the names it may use: every number a spec gives is
//! checked against a bound no machine passes before anything is sized, allocated or started,
//! so that no spec can make a component allocate without bound or overflow (a panic is a
//! denial of service). Names are Kubernetes' DNS-1123 labels: they become directory names,
//! Ray job ids and metric labels, so `.`, `..`, `/` and upper case never reach a path.

use crate::error::SpecError;

/// The longest name (a DNS-1123 label).
pub const MAX_NAME_LEN: usize = 63;

/// Processes of one role.
pub const MAX_REPLICAS: i64 = 100_000;
/// CPU per process, millicores (1,024 cores).
pub const MAX_CPU_MILLICORES: u64 = 1_024_000;
/// Memory per process, bytes (64 TiB).
pub const MAX_MEMORY_BYTES: u64 = 64 << 40;
/// GPUs per process.
pub const MAX_GPUS: u32 = 64;
/// Relaunches of one role.
pub const MAX_RESTARTS: i64 = 1_000_000;
/// Samples of the data set (2^40, about 1.1 trillion).
pub const MAX_SAMPLES: i64 = 1 << 40;
/// Shards over all epochs: the job master keeps a state and a queue entry for each shard of
/// every epoch (12 bytes: 48 MB at the limit).
pub const MAX_SHARDS: u64 = 4_000_000;
/// Held-out samples (generated and kept in memory by the built-in workload).
pub const MAX_EVAL_SAMPLES: i64 = 10_000_000;
/// Epochs.
pub const MAX_EPOCHS: i64 = 100_000;
/// The built-in workload's hash buckets (two f32 arrays of this length per process).
pub const MAX_HASH_BUCKETS: i64 = 1 << 28;
/// The built-in workload's fields per sample.
pub const MAX_FIELDS: i64 = 4096;
/// The built-in workload's vocabulary per field.
pub const MAX_VOCAB_PER_FIELD: i64 = 1 << 32;
/// The built-in workload's batch size.
pub const MAX_BATCH: i64 = 1 << 20;
/// The built-in workload's delay per sample, µs (one second).
pub const MAX_STEP_DELAY_US: i64 = 1_000_000;
/// Words of a command and bytes of one word.
pub const MAX_COMMAND_WORDS: usize = 1024;
pub const MAX_WORD_BYTES: usize = 4096;
/// Environment variables a job sets, and bytes of one value.
pub const MAX_ENV_VARS: usize = 256;
/// Role groups one job may name.
pub const MAX_ROLES: usize = 64;
pub const MAX_ENV_VALUE_BYTES: usize = 32 << 10;

/// Whether `name` is a DNS-1123 label: 1 to 63 lower-case letters, digits and '-', starting and
/// ending with a letter or digit. Why not, when it is not.
pub fn dns_label(name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-';
    if ok {
        return Ok(());
    }
    let shown: String = name.chars().take(80).collect();
    Err(format!(
        "{shown:?} is not a DNS-1123 label: 1 to {MAX_NAME_LEN} lower-case letters, digits and \
         '-', starting and ending with a letter or digit (e.g. \"ctr-train-2\")"
    ))
}

/// Refuses `v` above `max` at `path`, naming the limit.
pub fn at_most(path: &str, v: i64, max: i64) -> Result<(), SpecError> {
    if v > max {
        return Err(SpecError::new(
            path,
            format!("{v} is above the limit of {max}"),
        ));
    }
    Ok(())
}

/// [`at_most`] for unsigned amounts.
pub fn at_most_u64(path: &str, v: u64, max: u64, unit: &str) -> Result<(), SpecError> {
    if v > max {
        return Err(SpecError::new(
            path,
            format!("{v}{unit} is above the limit of {max}{unit}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for ok in ["a", "ctr-2", "0", &"a".repeat(63)] {
            assert_eq!(dns_label(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "a/b",
            "ä",
            " a",
            &"a".repeat(64),
        ] {
            let e = dns_label(bad).unwrap_err();
            assert!(e.contains("is not a DNS-1123 label"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_value_above_its_limit_names_the_limit() {
        let e = at_most("data.num_samples", MAX_SAMPLES + 1, MAX_SAMPLES).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "data.num_samples: {} is above the limit of {MAX_SAMPLES}",
                MAX_SAMPLES + 1
            )
        );
        assert!(at_most("x", MAX_SAMPLES, MAX_SAMPLES).is_ok());
    }
}
