//! Gavel's job traces (tab-separated, no header), in both of its formats:
//!
//! * 7 fields (the Philly-derived `msr` traces): `job_type, command, num_steps_arg,
//!   needs_data_dir, total_steps, arrival_time_s, scale_factor`.
//! * 10 fields (the physical-cluster traces): `job_type, command, working_directory,
//!   num_steps_arg, needs_data_dir, total_steps, scale_factor, priority_weight, SLO,
//!   arrival_time_s` (an SLO ≤ 0 means none).
//!
//! Gavel's measured throughputs (`simulation_throughputs.json`) are read by
//! `optimizer::throughput::table::MeasuredTable::from_gavel_json`.

use std::path::Path;

use crate::DatasetError;
use crate::table::{Layout, Table};

/// One job of a Gavel trace.
#[derive(Clone, Debug, PartialEq)]
pub struct GavelJob {
    /// E.g. `ResNet-50 (batch size 64)`, a key of the throughput file.
    pub job_type: String,
    pub command: String,
    pub total_steps: u64,
    /// GPUs the job runs on.
    pub scale_factor: u32,
    pub priority_weight: f64,
    /// Completion deadline relative to arrival, when the trace sets one.
    pub slo: Option<f64>,
    pub arrival_s: f64,
}

/// Reads a `.trace` file of either format (told apart by the first line's field count).
pub fn read_trace(path: &Path) -> Result<Vec<GavelJob>, DatasetError> {
    let text = std::fs::read_to_string(path).map_err(|source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let fields = text.lines().next().map_or(7, |l| l.split('\t').count());
    let format = match fields {
        7 | 10 => fields,
        n => {
            return Err(DatasetError::Value {
                path: path.to_path_buf(),
                line: 1,
                column: 1,
                message: format!("{n} tab-separated fields, expected 7 or 10 (a Gavel trace)"),
            });
        }
    };
    let t = Table::read(path, Layout::tsv_without_header(format))?;
    // Column of each value in the two formats.
    let (steps, arrival, scale, weight, slo) = if format == 7 {
        (4, 5, 6, None, None)
    } else {
        (5, 9, 6, Some(7), Some(8))
    };
    (0..t.rows())
        .map(|i| {
            Ok(GavelJob {
                job_type: t.text(i, 0)?.to_string(),
                command: t.text(i, 1)?.to_string(),
                total_steps: t.count(i, steps, 1)?,
                scale_factor: t.count(i, scale, 1)? as u32,
                priority_weight: match weight {
                    Some(c) => t.number(i, c, 0.0)?,
                    None => 1.0,
                },
                slo: match slo {
                    Some(c) => Some(t.parse::<f64>(i, c)?).filter(|s| *s > 0.0),
                    None => None,
                },
                arrival_s: t.number(i, arrival, 0.0)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> std::path::PathBuf {
        crate::bundled().join("gavel")
    }

    #[test]
    fn both_trace_formats_read() {
        let jobs = read_trace(&data().join("traces_msr_seed0/11cb48.trace")).unwrap();
        assert!(!jobs.is_empty());
        assert!(
            jobs.iter()
                .all(|j| j.slo.is_none() && j.priority_weight == 1.0)
        );
        let mut physical: Vec<_> = std::fs::read_dir(data().join("traces_physical_cluster"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        physical.sort();
        let jobs = read_trace(&physical[0]).unwrap();
        assert!(jobs[0].job_type.contains("batch size"), "{:?}", jobs[0]);
        assert!(
            jobs.iter()
                .all(|j| j.scale_factor >= 1 && j.total_steps >= 1)
        );
    }

    #[test]
    fn a_short_line_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.trace");
        std::fs::write(
            &p,
            "A\tcmd\t-n\t1\t100\t0.0\t1\nB\tcmd\t-n\t1\tmany\t5.0\t2\n",
        )
        .unwrap();
        let e = read_trace(&p).unwrap_err().to_string();
        assert!(
            e.contains("t.trace:2:5: field 5 `many` is not a valid value"),
            "{e}"
        );
        std::fs::write(&p, "A\tcmd\t1\n").unwrap();
        let e = read_trace(&p).unwrap_err().to_string();
        assert!(e.contains("t.trace:1:1: 3 tab-separated fields"), "{e}");
    }
}
