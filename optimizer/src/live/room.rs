//! What one process asks of a node and what is left on one ([`Process`], [`Room`]), as the
//! nodes' gate (`nodes.rs`) counts them. GPUs come off a node's devices as Ray's raylet hands
//! them out ([`take_on_devices`], from `vocab::devices`, which the brain's view of a Ray
//! node's devices and the job master's placement on Ray follow too).

use vocab::devices::fits_on_devices;
pub use vocab::devices::take_on_devices;

/// A GPU model as [`Free`] numbers them; `None`: any model (a process), no GPUs (a node).
pub(super) type Model = Option<u16>;

/// One process to place: CPU (millicores), memory (bytes), GPUs (thousandths of a device)
/// and the GPUs' model. Ordered GPUs first: the largest processes are placed first, those
/// with GPUs before all others.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Process {
    pub(super) gpus: u32,
    pub(super) cpu: u64,
    pub(super) memory: u64,
    pub(super) model: Model,
}

impl Process {
    /// Whether it fits in the room `r` of a node.
    pub(super) fn fits_in(&self, r: &Room) -> bool {
        r.cpu >= self.cpu
            && r.memory >= self.memory
            && (self.gpus == 0
                || (self.model.is_none_or(|m| r.model == Some(m)) && r.holds_gpus(self.gpus)))
    }
    pub(super) fn take_from(&self, r: &mut Room) {
        r.cpu -= self.cpu;
        r.memory = r.memory.saturating_sub(self.memory);
        r.take_gpus(self.gpus);
    }
    /// Gives back the CPU and memory of a process of no GPUs (what the gate's give-back is
    /// for: where a share came off, the room does not keep).
    pub(super) fn give_to(&self, r: &mut Room) {
        debug_assert_eq!(self.gpus, 0, "only room without GPUs is given back");
        r.cpu += self.cpu;
        r.memory = r.memory.saturating_add(self.memory);
    }

    /// The process with `millicores` and `memory_bytes` more beside it on its node (the
    /// processes that share its devices, laid out with it as one bundle).
    pub(super) fn with(self, millicores: u64, memory_bytes: u64) -> Process {
        Process {
            cpu: self.cpu + millicores,
            memory: self.memory.saturating_add(memory_bytes),
            ..self
        }
    }
}

/// The room left on one node: CPU, memory, GPUs (thousandths) of its model, in all and, where
/// the snapshot gives them, device by device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Room {
    pub(super) cpu: u64,
    pub(super) memory: u64,
    pub(super) gpus: u32,
    pub(super) model: Model,
    /// Each device's free thousandths (empty: not known, only `gpus` is).
    pub(super) devices: Vec<u32>,
}

impl Room {
    /// Whether `gpus` thousandths fit in it: on its devices as Ray hands them out
    /// ([`take_on_devices`]) where they are known, else in its amount.
    fn holds_gpus(&self, gpus: u32) -> bool {
        self.gpus >= gpus && (self.devices.is_empty() || fits_on_devices(&self.devices, gpus))
    }

    /// Takes `gpus` thousandths off it, as [`Room::holds_gpus`] found them.
    fn take_gpus(&mut self, gpus: u32) {
        self.gpus -= match self.devices.is_empty() {
            true => gpus,
            false => take_on_devices(&mut self.devices, gpus).expect("checked by holds_gpus"),
        };
    }

    /// Its devices' free shares as the reasons name them where they are split (`0.3 + 0.3`);
    /// none where each is whole or unused, or they are not known.
    pub(super) fn devices_shown(&self) -> Option<String> {
        vocab::devices::shown(&self.devices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        /// Devices' room as processes of shares and whole GPUs come and are taken from it:
        /// each process is taken where it fits as Ray hands GPUs out, none is refused that
        /// fits so, and the node's amount is always its devices' sum, none over a device.
        #[test]
        fn gpus_are_taken_device_by_device_as_ray_hands_them_out(
            free in proptest::collection::vec(0u32..=1000, 1..6),
            asks in proptest::collection::vec(
                proptest::prop_oneof![1u32..1000, (1u32..3).prop_map(|n| n * 1000)],
                1..12,
            ),
        ) {
            let mut room = Room {
                cpu: 0,
                memory: 0,
                gpus: free.iter().sum(),
                model: Some(0),
                devices: free,
            };
            for g in asks {
                let fits = match g < 1000 {
                    true => room.devices.iter().any(|&d| d >= g),
                    false => room.devices.iter().filter(|&&d| d == 1000).count() as u32 >= g / 1000,
                };
                proptest::prop_assert_eq!(room.holds_gpus(g), fits, "{} on {:?}", g, room.devices);
                if !fits {
                    continue;
                }
                let before = room.devices.clone();
                room.take_gpus(g);
                let changed: Vec<usize> =
                    (0..before.len()).filter(|&i| before[i] != room.devices[i]).collect();
                if g < 1000 {
                    // One device, the one it fits best.
                    proptest::prop_assert_eq!(changed.len(), 1);
                    let best = before.iter().filter(|&&d| d >= g).min().copied();
                    proptest::prop_assert_eq!(Some(before[changed[0]]), best);
                    proptest::prop_assert_eq!(before[changed[0]] - room.devices[changed[0]], g);
                } else {
                    // Whole devices, each unused before.
                    proptest::prop_assert_eq!(changed.len() as u32, g / 1000);
                    proptest::prop_assert!(changed.iter().all(|&i| before[i] == 1000 && room.devices[i] == 0));
                }
                proptest::prop_assert_eq!(room.gpus, room.devices.iter().sum::<u32>());
                proptest::prop_assert!(room.devices.iter().all(|&d| d <= 1000));
            }
        }
    }
}
