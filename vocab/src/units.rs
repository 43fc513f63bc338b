//! Units as newtypes, so millicores are never bytes and a count is never a job id.
//!
//! [`Millicores`] and [`Bytes`] (de)serialize as plain integers in the unit their name says
//! (policy files, snapshots, JSON). A job spec writes them as Kubernetes-style quantities
//! (`cpu: 2`, `0.5`, `"500m"`; `memory: "512Mi"`, `"2Gi"`, `1073741824`): its fields go through
//! [`quantity`].

use serde::{Deserialize, Serialize};

/// CPU in thousandths of a core.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Millicores(pub u64);

/// Memory in bytes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

/// Kubernetes-style quantities for the job spec's `cpu` and `memory` fields.
pub mod quantity {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    use super::{Bytes, Millicores};

    /// A number or a quantity string, before it is given a unit.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Quantity {
        Int(u64),
        Float(f64),
        Text(String),
    }

    fn cpu(q: Quantity) -> Result<Millicores, String> {
        let cores =
            match q {
                Quantity::Int(n) => n as f64,
                Quantity::Float(x) => x,
                Quantity::Text(s) => match s.strip_suffix('m') {
                    Some(milli) => {
                        return milli.trim().parse::<u64>().map(Millicores).map_err(|_| {
                            format!("cpu quantity {s:?} is not a number of millicores")
                        });
                    }
                    None => s
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| format!("cpu quantity {s:?} is not a number of cores"))?,
                },
            };
        if !cores.is_finite() || cores < 0.0 {
            return Err(format!(
                "cpu quantity {cores} must be a non-negative number of cores"
            ));
        }
        Ok(Millicores((cores * 1000.0).round() as u64))
    }

    fn memory(q: Quantity) -> Result<Bytes, String> {
        match q {
            Quantity::Int(n) => Ok(Bytes(n)),
            Quantity::Float(x) if x.is_finite() && x >= 0.0 => Ok(Bytes(x as u64)),
            Quantity::Float(x) => Err(format!(
                "memory quantity {x} must be a non-negative number of bytes"
            )),
            Quantity::Text(s) => {
                const UNITS: [(&str, u64); 8] = [
                    ("Ki", 1 << 10),
                    ("Mi", 1 << 20),
                    ("Gi", 1 << 30),
                    ("Ti", 1 << 40),
                    ("K", 1_000),
                    ("M", 1_000_000),
                    ("G", 1_000_000_000),
                    ("T", 1_000_000_000_000),
                ];
                let t = s.trim();
                let (num, mult) = UNITS
                    .iter()
                    .find_map(|(suffix, mult)| t.strip_suffix(suffix).map(|n| (n, *mult)))
                    .unwrap_or((t, 1));
                let n: f64 = num.trim().parse().map_err(|_| {
                    format!(
                        "memory quantity {s:?} is not a number with an optional unit (Ki, Mi, Gi, K, M, G)"
                    )
                })?;
                if !n.is_finite() || n < 0.0 {
                    return Err(format!("memory quantity {s:?} must be non-negative"));
                }
                Ok(Bytes((n * mult as f64) as u64))
            }
        }
    }

    /// `Option<Millicores>` as a quantity: written `"500m"`.
    pub mod opt_cpu {
        use super::*;

        pub fn serialize<S: Serializer>(v: &Option<Millicores>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(m) => s.serialize_some(&format!("{}m", m.0)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Millicores>, D::Error> {
            Option::<Quantity>::deserialize(d)?
                .map(cpu)
                .transpose()
                .map_err(D::Error::custom)
        }
    }

    /// `Option<Bytes>` as a quantity: written as the number of bytes.
    pub mod opt_memory {
        use super::*;

        pub fn serialize<S: Serializer>(v: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(b) => s.serialize_some(&b.0.to_string()),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
            Option::<Quantity>::deserialize(d)?
                .map(memory)
                .transpose()
                .map_err(D::Error::custom)
        }
    }
}
