//! A node's GPUs device by device, as Ray's raylet hands them out: a share (less than one
//! device) goes on the one device it fits best, whole GPUs on devices with nothing used
//! ([`take_on_devices`], read in Ray's `resource_instance_set.cc`). Ray's APIs give a node's
//! free GPUs as one amount only; [`free_by_device`] rebuilds how they are split from the
//! devices our own processes were given ([`DeviceUse`], from the `CUDA_VISIBLE_DEVICES` their
//! agents registered). The brain's rounds (`brain::capacity`) and a job master's placement on
//! Ray (`job_master::platform::ray`) both count devices so; the optimizer's nodes' gate
//! places on them.
//!
//! Amounts are thousandths of a device (`400`: 0.4 of one, `2000`: two whole GPUs).

use std::collections::BTreeMap;

/// Whether `gpus` thousandths fit on `devices` (each one's free thousandths) as Ray's raylet
/// hands GPUs out: a share (less than one device) on one device with that much free, whole
/// GPUs (as many devices as it touches) on devices with nothing used.
pub fn fits_on_devices(devices: &[u32], gpus: u32) -> bool {
    match gpus {
        0 => true,
        g if g < 1000 => devices.iter().any(|&d| d >= g),
        g => devices.iter().filter(|&&d| d >= 1000).count() as u32 >= g.div_ceil(1000),
    }
}

/// Takes `gpus` thousandths off `devices` (each one's free thousandths) as Ray's raylet does:
/// whole GPUs from the first devices with nothing used, a share from the device it fits best
/// (the least left after it, the first among equals). The thousandths taken; `None`, and
/// nothing taken, where it does not fit so.
pub fn take_on_devices(devices: &mut [u32], gpus: u32) -> Option<u32> {
    if !fits_on_devices(devices, gpus) {
        return None;
    }
    if gpus < 1000 {
        if let Some(best) = device_for_share(devices, gpus) {
            devices[best] -= gpus;
        }
        return Some(gpus);
    }
    let mut taken = 0;
    for d in devices
        .iter_mut()
        .filter(|d| **d >= 1000)
        .take(gpus.div_ceil(1000) as usize)
    {
        taken += *d;
        *d = 0;
    }
    Some(taken)
}

/// The device a share of `gpus` thousandths (less than one device) goes on as Ray's raylet
/// hands it out: the one it fits best (the least left after it, the first among equals).
pub fn device_for_share(devices: &[u32], gpus: u32) -> Option<usize> {
    (0..devices.len())
        .filter(|&i| devices[i] >= gpus)
        .min_by_key(|&i| (devices[i] - gpus, i))
}

/// Whether processes asking for `shares` (thousandths each, every one below one device) that
/// are to share one device get one, each handed its share by Ray on its own (best fit), in
/// whichever order they come: where one device has exactly one partner's share free and
/// another the whole bundle's, the first partner may land on the first and the others not.
pub fn land_together(devices: &[u32], shares: &[u32]) -> bool {
    fn every_order(devices: &mut Vec<u32>, left: &mut Vec<u32>, on: Option<usize>) -> bool {
        if left.is_empty() {
            return true;
        }
        (0..left.len()).all(|i| {
            let share = left.remove(i);
            let landed = device_for_share(devices, share)
                .filter(|&d| on.is_none_or(|o| o == d))
                .is_some_and(|d| {
                    devices[d] -= share;
                    let rest = every_order(devices, left, Some(d));
                    devices[d] += share;
                    rest
                });
            left.insert(i, share);
            landed
        })
    }
    shares.iter().all(|&s| s < 1000)
        && every_order(&mut devices.to_vec(), &mut shares.to_vec(), None)
}

/// The GPU shares processes hold, device by device: by node (as the platform names it), by
/// device (as `CUDA_VISIBLE_DEVICES` names it), the thousandths of it held.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceUse(pub BTreeMap<String, BTreeMap<String, u32>>);

impl DeviceUse {
    /// Counts a process of `gpus` given `devices` (comma-separated) on `host`: its amount
    /// spread evenly over the devices it names (a share on its one device, whole GPUs one
    /// each), at most a whole device each. One not placed, or given none, counts nothing.
    pub fn add(&mut self, host: &str, devices: &str, gpus: crate::Gpus) {
        let named: Vec<&str> = devices
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .collect();
        if host.is_empty() || named.is_empty() || gpus.is_zero() {
            return;
        }
        let each = (gpus.milli() / named.len() as u32).min(1000);
        let node = self.0.entry(host.to_string()).or_default();
        for d in named {
            let held = node.entry(d.to_string()).or_default();
            *held = (*held + each).min(1000);
        }
    }

    /// Counts what `other` counts too, device by device (at most a whole device each).
    pub fn merge(&mut self, other: &DeviceUse) {
        for (host, devices) in &other.0 {
            let node = self.0.entry(host.clone()).or_default();
            for (d, &h) in devices {
                let held = node.entry(d.clone()).or_default();
                *held = (*held + h).min(1000);
            }
        }
    }

    /// Each device held, as a command line names it: `NODE:DEVICE=THOUSANDTHS`
    /// (`10.0.0.2:1=700`), what [`DeviceUse::add_named`] reads back.
    pub fn named(&self) -> impl Iterator<Item = String> + '_ {
        self.0
            .iter()
            .flat_map(|(node, devices)| devices.iter().map(move |(d, h)| format!("{node}:{d}={h}")))
    }

    /// Counts one device held as [`DeviceUse::named`] writes it; `Err` says what is wrong.
    pub fn add_named(&mut self, s: &str) -> Result<(), String> {
        let bad = |why: &str| format!("{s:?}: {why} (NODE:DEVICE=THOUSANDTHS, as 10.0.0.2:1=700)");
        let (at, milli) = s.split_once('=').ok_or_else(|| bad("no `=`"))?;
        let (node, device) = at.rsplit_once(':').ok_or_else(|| bad("no `:`"))?;
        let milli: u32 = milli
            .trim()
            .parse()
            .map_err(|_| bad("the thousandths are not a whole number"))?;
        if node.is_empty() || device.is_empty() || milli == 0 || milli > 1000 {
            return Err(bad("a node, a device and 1 to 1000 thousandths"));
        }
        let held = self
            .0
            .entry(node.to_string())
            .or_default()
            .entry(device.to_string())
            .or_default();
        *held = (*held + milli).min(1000);
        Ok(())
    }

    /// What the processes counted hold on `host`, by device (none: no device of it is named).
    pub fn on(&self, host: &str) -> Option<&BTreeMap<String, u32>> {
        self.0.get(host).filter(|d| !d.is_empty())
    }
}

/// A node's free room device by device (each device's free thousandths), from its `total`
/// devices, the `free` thousandths its platform counts (Ray's available GPUs) and what
/// processes we know of hold there (`held`, by device): each device named in `held` less what
/// they hold of it, each other device whole; where the platform counts less free than that
/// (other users' processes, or ours not known yet), the difference is laid out as Ray would
/// lay out one process of that size (`take_unseen`). `None` where no device is named and
/// the platform counts some but not all of them free: how they are split is not known.
pub fn free_by_device(
    total: u32,
    free: u32,
    held: Option<&BTreeMap<String, u32>>,
) -> Option<Vec<u32>> {
    let mut devices: Vec<u32> = match held {
        None if free == 0 => vec![0; total as usize],
        None if free >= total * 1000 => vec![1000; total as usize],
        None => return None,
        Some(named) => named.values().map(|&h| 1000 - h.min(1000)).collect(),
    };
    let unnamed = (total as usize).saturating_sub(devices.len());
    devices.extend(std::iter::repeat_n(1000, unnamed));
    let counted: u32 = devices.iter().sum();
    take_unseen(&mut devices, counted.saturating_sub(free));
    Some(devices)
}

/// Takes `milli` thousandths that the platform counts used but no process we know of holds
/// off `devices` (free thousandths each) as Ray hands a process of that size out
/// ([`take_on_devices`]): its whole GPUs one device at a time, then the share left; what does
/// not fit so from the freest devices.
fn take_unseen(devices: &mut [u32], mut milli: u32) {
    while milli >= 1000 && take_on_devices(devices, 1000).is_some() {
        milli -= 1000;
    }
    if milli == 0 || take_on_devices(devices, milli).is_some() {
        return;
    }
    while milli > 0 {
        let Some(freest) = (0..devices.len())
            .filter(|&i| devices[i] > 0)
            .max_by_key(|&i| (devices[i], std::cmp::Reverse(i)))
        else {
            return;
        };
        let took = devices[freest].min(milli);
        devices[freest] -= took;
        milli -= took;
    }
}

/// Devices' free shares as messages name them where they are split (`0.3 + 0.3`); none where
/// each is whole or unused.
pub fn shown(devices: &[u32]) -> Option<String> {
    devices.iter().any(|d| d % 1000 != 0).then(|| {
        devices
            .iter()
            .map(|&d| crate::Gpus::from_milli(d).to_string())
            .collect::<Vec<_>>()
            .join(" + ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|&(d, h)| (d.to_string(), h)).collect()
    }

    #[test]
    fn a_nodes_devices_are_rebuilt_from_what_is_known_and_the_platforms_amount() {
        // Ours hold 0.7 of device 0; Ray counts 0.6 free of 2: another 0.7 somewhere, on
        // device 1 as Ray would place it.
        assert_eq!(
            free_by_device(2, 600, Some(&held(&[("0", 700)]))),
            Some(vec![300, 300])
        );
        // All that Ray counts used is ours: the other device is whole.
        assert_eq!(
            free_by_device(2, 1300, Some(&held(&[("0", 700)]))),
            Some(vec![300, 1000])
        );
        // A whole GPU unseen takes a device with nothing used, then a share best fit.
        assert_eq!(
            free_by_device(4, 1300, Some(&held(&[("1", 700)]))),
            Some(vec![300, 0, 0, 1000])
        );
        // Nothing named: only all free or none free is known.
        assert_eq!(free_by_device(2, 2000, None), Some(vec![1000, 1000]));
        assert_eq!(free_by_device(2, 0, None), Some(vec![0, 0]));
        assert_eq!(free_by_device(2, 600, None), None);
        // More unseen than fits Ray's way: a whole GPU, then what is left off the freest
        // devices in turn.
        assert_eq!(
            free_by_device(3, 200, Some(&held(&[("0", 400), ("1", 500)]))),
            Some(vec![0, 200, 0])
        );
    }

    #[test]
    fn partners_land_on_one_device_only_where_every_order_of_them_does() {
        // Halves: one device with a whole GPU free holds both.
        assert!(land_together(&[1000, 300], &[500, 500]));
        // 0.5 free on each of two: no device holds the pair.
        assert!(!land_together(&[500, 500], &[500, 500]));
        // One device has exactly the first's share, another the pair's: the first lands on
        // the first (best fit) and the second cannot follow.
        assert!(!land_together(&[300, 1000], &[300, 500]));
        // Where the first could come second too: 0.3 best fits device 0 in either order.
        assert!(land_together(&[800, 1000], &[300, 500]));
        assert!(!land_together(&[1000], &[1000]));
    }

    #[test]
    fn a_process_counts_its_amount_spread_over_the_devices_it_was_given() {
        let mut used = DeviceUse::default();
        used.add("n", "1", crate::Gpus::from_milli(400));
        used.add("n", "1", crate::Gpus::from_milli(300));
        used.add("n", "2, 3", crate::Gpus::from_milli(2000));
        used.add("", "0", crate::Gpus::from_milli(1000));
        used.add("m", "", crate::Gpus::from_milli(1000));
        assert_eq!(
            used.on("n"),
            Some(&held(&[("1", 700), ("2", 1000), ("3", 1000)]))
        );
        assert_eq!(used.on("m"), None);
        let mut more = DeviceUse::default();
        more.add("n", "1", crate::Gpus::from_milli(500));
        more.add("m", "0", crate::Gpus::from_milli(200));
        used.merge(&more);
        assert_eq!(
            used.on("n"),
            Some(&held(&[("1", 1000), ("2", 1000), ("3", 1000)]))
        );
        assert_eq!(used.on("m"), Some(&held(&[("0", 200)])));
        // As a command line names them, and back.
        let named: Vec<String> = used.named().collect();
        assert_eq!(named[0], "m:0=200");
        let mut back = DeviceUse::default();
        for n in &named {
            back.add_named(n).unwrap();
        }
        assert_eq!(back, used);
        for bad in ["n:1", "n=5", "n:1=x", ":1=5", "n:1=0", "n:1=1001"] {
            let e = DeviceUse::default().add_named(bad).unwrap_err();
            assert!(e.contains("NODE:DEVICE=THOUSANDTHS"), "{e}");
        }
        assert_eq!(shown(&[300, 300]).as_deref(), Some("0.3 + 0.3"));
        assert_eq!(shown(&[1000, 0]), None);
    }
}
