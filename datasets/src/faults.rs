//! Fault traces for the what-if simulator: faults at set times on set nodes
//! (`brainctl whatif --faults FILE`).
//!
//! A CSV with the header `time_s,node,kind,seconds,factor`: `kind` is `crash` (the node fails
//! and its jobs' processes exit), `hang` (it fails and its jobs hang in a collective) or `slow`
//! (it computes at `factor` of its speed); `seconds` is how long the node is down, or slow;
//! `factor` is given for `slow` only. `node` is the node's position in the simulated cluster,
//! from 0.

use std::path::Path;

use optimizer::sim::engine::{FaultKind, ScriptedFault};

use crate::DatasetError;
use crate::table::{Layout, Table};

pub const HEADER: [&str; 5] = ["time_s", "node", "kind", "seconds", "factor"];

/// Reads a fault trace for a cluster of `nodes` nodes; the first value it cannot replay is
/// refused with its file, line and column.
pub fn read_faults(path: &Path, nodes: usize) -> Result<Vec<ScriptedFault>, DatasetError> {
    let t = Table::read(path, Layout::csv(&HEADER))?;
    (0..t.rows())
        .map(|i| {
            let node = t.count(i, 1, 0)? as usize;
            if node >= nodes {
                return Err(t.error(
                    i,
                    1,
                    format!(
                        "node {node} is not in the cluster, whose nodes are 0 to {}",
                        nodes.saturating_sub(1)
                    ),
                ));
            }
            let seconds = t.number(i, 3, 0.0)?;
            let factor = t.optional_text(i, 4);
            let kind = match t.text(i, 2)?.trim() {
                "crash" | "hang" if factor.is_some() => {
                    return Err(t.error(i, 4, "`factor` is for a `slow` fault only"));
                }
                "crash" => FaultKind::Crash { down_s: seconds },
                "hang" => FaultKind::Hang { down_s: seconds },
                "slow" => {
                    let factor = t.number(i, 4, 0.0)?;
                    if !(factor > 0.0 && factor < 1.0) {
                        return Err(t.error(
                            i,
                            4,
                            format!("`factor` is {factor}: a slowed node's speed, in (0, 1)"),
                        ));
                    }
                    if seconds <= 0.0 {
                        return Err(t.error(i, 3, "a slowdown lasts more than 0 seconds"));
                    }
                    FaultKind::Slow {
                        factor,
                        duration_s: seconds,
                    }
                }
                other => {
                    return Err(t.error(
                        i,
                        2,
                        format!("`kind` is {other:?}: one of crash, hang, slow"),
                    ));
                }
            };
            Ok(ScriptedFault {
                at_s: t.number(i, 0, 0.0)?,
                node,
                kind,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str, nodes: usize) -> Result<Vec<ScriptedFault>, DatasetError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.csv");
        std::fs::write(&path, format!("{}\n{body}", HEADER.join(","))).unwrap();
        read_faults(&path, nodes)
    }

    #[test]
    fn a_fault_trace_reads_as_faults_at_set_times() {
        let faults = read("60,0,crash,600,\n120.5,3,hang,30,\n300,1,slow,900,0.5\n", 4).unwrap();
        assert_eq!(
            faults,
            vec![
                ScriptedFault {
                    at_s: 60.0,
                    node: 0,
                    kind: FaultKind::Crash { down_s: 600.0 }
                },
                ScriptedFault {
                    at_s: 120.5,
                    node: 3,
                    kind: FaultKind::Hang { down_s: 30.0 }
                },
                ScriptedFault {
                    at_s: 300.0,
                    node: 1,
                    kind: FaultKind::Slow {
                        factor: 0.5,
                        duration_s: 900.0
                    }
                },
            ]
        );
    }

    #[test]
    fn a_value_it_cannot_replay_is_refused_where_it_is() {
        for (body, expected) in [
            (
                "60,4,crash,600,\n",
                "faults.csv:2:2: node 4 is not in the cluster, whose nodes are 0 to 3",
            ),
            (
                "60,0,melt,600,\n",
                "faults.csv:2:3: `kind` is \"melt\": one of crash, hang, slow",
            ),
            ("60,0,slow,600,1.5\n", "faults.csv:2:5: `factor` is 1.5"),
            (
                "60,0,crash,600,0.5\n",
                "faults.csv:2:5: `factor` is for a `slow` fault only",
            ),
            ("-1,0,crash,600,\n", "faults.csv:2:1:"),
        ] {
            let e = read(body, 4).unwrap_err().to_string();
            assert!(e.contains(expected), "{body}: {e}");
        }
    }
}
