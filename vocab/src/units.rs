//! Units as newtypes, so millicores are never bytes and a count is never a job id.
//!
//! [`Millicores`] and [`Bytes`] (de)serialize as plain integers in the unit their name says
//! (policy files, snapshots, JSON). A job spec writes them as Kubernetes-style quantities
//! (`cpu: 2`, `0.5`, `"500m"`; `memory: "512Mi"`, `"2Gi"`, `1073741824`): its fields go through
//! [`quantity`]. [`Gpus`] counts thousandths of a device but is written everywhere as a number of
//! GPUs (`1`, `0.4`), so rows and files written when GPUs were whole numbers read unchanged.

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

/// GPUs in thousandths of a device: `Gpus(400)` is 0.4 of one GPU (processes that share a
/// device), `Gpus(2000)` two whole ones. (De)serialized as a number of GPUs: an integer when
/// whole, else a decimal (`0.4`); finer than a thousandth is refused, not rounded away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gpus(u32);

impl Gpus {
    /// One whole device.
    pub const ONE: Gpus = Gpus(1000);
    pub const ZERO: Gpus = Gpus(0);

    pub const fn whole(n: u32) -> Gpus {
        Gpus(n.saturating_mul(1000))
    }
    pub const fn from_milli(m: u32) -> Gpus {
        Gpus(m)
    }
    pub const fn milli(self) -> u32 {
        self.0
    }
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
    /// A share of one device (more than none, less than one).
    pub const fn is_fraction(self) -> bool {
        self.0 > 0 && self.0 < 1000
    }
    pub const fn is_whole(self) -> bool {
        self.0.is_multiple_of(1000)
    }
    /// The devices it touches: whole GPUs, a fraction counting as one.
    pub const fn devices(self) -> u32 {
        self.0.div_ceil(1000)
    }
    /// Processes of this size that share one device (`⌊1 / share⌋`); 1 for whole GPUs, 0 for
    /// none.
    pub const fn per_device(self) -> u32 {
        match self.0 {
            0 => 0,
            m if m < 1000 => 1000 / m,
            _ => 1,
        }
    }
    /// The devices `n` processes of this size take: whole GPUs each their own, shares packed
    /// [`Self::per_device`] to a device.
    pub const fn devices_for(self, n: u32) -> u32 {
        if self.is_fraction() {
            n.div_ceil(self.per_device())
        } else {
            n.saturating_mul(self.devices())
        }
    }
    /// How many processes of this size `devices` devices hold (the inverse of
    /// [`Self::devices_for`]); 0 for a process of no GPU.
    pub const fn fit_in(self, devices: u32) -> u32 {
        if self.is_zero() {
            0
        } else if self.is_fraction() {
            devices.saturating_mul(self.per_device())
        } else {
            devices / self.devices()
        }
    }
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }
    /// From a number of GPUs; why not when it is negative, not finite, or finer than 0.001.
    pub fn from_f64(x: f64) -> Result<Gpus, String> {
        if !x.is_finite() || x < 0.0 {
            return Err(format!("gpu {x} must be a non-negative number of GPUs"));
        }
        let m = (x * 1000.0).round();
        if (m - x * 1000.0).abs() > 1e-6 || m > u32::MAX as f64 {
            return Err(format!(
                "gpu {x} is not a whole number of thousandths of a GPU (0.001 is the finest share)"
            ));
        }
        Ok(Gpus(m as u32))
    }
}

impl std::fmt::Display for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_whole() {
            write!(f, "{}", self.0 / 1000)
        } else {
            // 0.4, 1.25: as many decimals as it has.
            let s = format!("{}.{:03}", self.0 / 1000, self.0 % 1000);
            f.write_str(s.trim_end_matches('0'))
        }
    }
}

impl std::ops::Add for Gpus {
    type Output = Gpus;
    fn add(self, o: Gpus) -> Gpus {
        Gpus(self.0.saturating_add(o.0))
    }
}

impl std::iter::Sum for Gpus {
    fn sum<I: Iterator<Item = Gpus>>(it: I) -> Gpus {
        it.fold(Gpus::ZERO, |a, b| a + b)
    }
}

impl Serialize for Gpus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_whole() {
            s.serialize_u32(self.0 / 1000)
        } else {
            s.serialize_f64(self.as_f64())
        }
    }
}

impl<'de> Deserialize<'de> for Gpus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Gpus, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Number {
            Int(u64),
            Float(f64),
        }
        match Number::deserialize(d)? {
            Number::Int(n) => u32::try_from(n)
                .ok()
                .and_then(|n| n.checked_mul(1000))
                .map(Gpus)
                .ok_or_else(|| serde::de::Error::custom(format!("gpu {n} is too large"))),
            Number::Float(x) => Gpus::from_f64(x).map_err(serde::de::Error::custom),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::Gpus;

    #[test]
    fn gpus_read_and_write_as_a_number_of_devices() {
        let g: Gpus = serde_json::from_str("2").unwrap();
        assert_eq!(g, Gpus::whole(2));
        assert_eq!(serde_json::to_string(&g).unwrap(), "2");
        let f: Gpus = serde_json::from_str("0.4").unwrap();
        assert_eq!((f.milli(), f.is_fraction(), f.devices()), (400, true, 1));
        assert_eq!(serde_json::to_string(&f).unwrap(), "0.4");
        assert_eq!(f.to_string(), "0.4");
        assert_eq!(Gpus::from_milli(1250).to_string(), "1.25");
        assert_eq!(Gpus::whole(3).to_string(), "3");
        for bad in ["-1", "0.0004", "1e12"] {
            assert!(serde_json::from_str::<Gpus>(bad).is_err(), "{bad}");
        }
        assert_eq!(Gpus::from_milli(300) + Gpus::from_milli(700), Gpus::ONE);
        // 0.4: two to a device; 2: two devices each.
        let (share, two) = (Gpus::from_milli(400), Gpus::whole(2));
        assert_eq!((share.devices_for(3), share.fit_in(3)), (2, 6));
        assert_eq!((two.devices_for(3), two.fit_in(5)), (6, 2));
        assert_eq!((Gpus::ONE.devices_for(4), Gpus::ZERO.fit_in(8)), (4, 0));
    }
}
