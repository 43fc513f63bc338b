//! Resource sampling of one process: CPU and RSS from procfs, GPU utilisation and memory from
//! NVML when it loads. Where NVML is absent (no driver, no GPU) the probe says so once and
//! reports "no GPU" from then on; that is not an error.

use std::time::Instant;

use procfs::Current;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use proto::jobmaster::v1::ResourceSample;

/// CPU time and RSS of a process, from `/proc/<pid>/stat`; of the process and its descendants
/// for a confined one (bubblewrap is the agent's child, the command its descendant).
pub struct ProcSampler {
    pid: i32,
    last: Option<(Instant, u64)>,
    ticks_per_second: u64,
    page_size: u64,
    tree: bool,
}

impl ProcSampler {
    pub fn new(pid: u32) -> Self {
        Self {
            pid: pid as i32,
            last: None,
            ticks_per_second: procfs::ticks_per_second().max(1),
            page_size: procfs::page_size(),
            tree: false,
        }
    }

    /// Samples the process with its descendants.
    pub fn with_descendants(mut self) -> Self {
        self.tree = true;
        self
    }

    /// The processes sampled: the process, and its descendants when so made.
    pub fn pids(&self) -> Vec<u32> {
        if self.tree {
            crate::sandbox::process_tree(self.pid as u32)
                .into_iter()
                .map(|(p, _)| p as u32)
                .collect()
        } else {
            vec![self.pid as u32]
        }
    }

    /// (millicores used since the previous sample, resident bytes). The first sample's CPU is
    /// averaged over the process's lifetime so far.
    pub fn sample(&mut self) -> Option<(u64, u64)> {
        let p = procfs::process::Process::new(self.pid).ok()?;
        let mut stat = p.stat().ok()?;
        if self.tree {
            // The tree's CPU time and resident pages, under the root's start time.
            let (mut ticks, mut rss) = (0, 0);
            for pid in self.pids() {
                if let Some(s) = procfs::process::Process::new(pid as i32)
                    .ok()
                    .and_then(|p| p.stat().ok())
                {
                    ticks += s.utime + s.stime;
                    rss += s.rss;
                }
            }
            stat.utime = ticks;
            stat.stime = 0;
            stat.rss = rss;
        }
        let ticks = stat.utime + stat.stime;
        let now = Instant::now();
        let millicores = match self.last {
            Some((t, prev)) => {
                let secs = now.duration_since(t).as_secs_f64();
                if secs > 0.0 {
                    ((ticks.saturating_sub(prev)) as f64 / self.ticks_per_second as f64 / secs
                        * 1000.0) as u64
                } else {
                    0
                }
            }
            None => {
                let uptime_ticks = procfs::Uptime::current()
                    .ok()
                    .map(|u| (u.uptime * self.ticks_per_second as f64) as u64);
                match uptime_ticks {
                    Some(up) if up > stat.starttime => {
                        let age = (up - stat.starttime) as f64;
                        (ticks as f64 / age * 1000.0) as u64
                    }
                    _ => 0,
                }
            }
        };
        self.last = Some((now, ticks));
        Some((millicores, stat.rss * self.page_size))
    }
}

/// Names a JSON file that stands in for the node's GPUs, read at every sample, on machines
/// without one (the tests' device stand-in; never set where NVML is meant to be read):
/// `{"devices": [{"utilisation_pct": 37, "memory_bytes": 536870912}]}`, each device's
/// utilisation and the memory the sampled process holds on it.
pub const GPU_STANDIN_ENV: &str = "BRAIN_GPU_STANDIN";

/// Where GPU figures come from.
enum Devices {
    Nvml(Box<Nvml>),
    /// The file [`GPU_STANDIN_ENV`] names.
    StandIn(std::path::PathBuf),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StandIn {
    devices: Vec<StandInDevice>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StandInDevice {
    utilisation_pct: u32,
    memory_bytes: u64,
}

/// NVML if it loads on this machine (or the device stand-in).
pub struct GpuProbe {
    nvml: Option<Devices>,
    /// The devices this process was given (`CUDA_VISIBLE_DEVICES`: NVML indices or UUIDs);
    /// `None`: every device.
    only: Option<Vec<String>>,
}

/// Whether device `index` (UUID `uuid`) is one of `only`'s.
fn visible(only: Option<&[String]>, index: u32, uuid: impl FnOnce() -> Option<String>) -> bool {
    let Some(only) = only else {
        return true;
    };
    if only.iter().any(|d| *d == index.to_string()) {
        return true;
    }
    uuid().is_some_and(|u| {
        only.iter()
            .any(|d| u.starts_with(d.as_str()) && d.starts_with("GPU-"))
    })
}

impl GpuProbe {
    /// Tries to load NVML once; logs "no GPU" once when it cannot.
    pub fn new() -> Self {
        let only = std::env::var("CUDA_VISIBLE_DEVICES").ok().map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_string)
                .collect()
        });
        if let Some(path) = std::env::var_os(GPU_STANDIN_ENV) {
            tracing::warn!(
                "GPU figures from the stand-in {} ({GPU_STANDIN_ENV}), not NVML",
                std::path::Path::new(&path).display()
            );
            return Self {
                nvml: Some(Devices::StandIn(path.into())),
                only,
            };
        }
        let nvml = match Nvml::init() {
            Ok(nvml) => {
                tracing::info!(
                    "NVML loaded: {} GPU(s); sampling {}",
                    nvml.device_count().unwrap_or(0),
                    only.as_ref()
                        .map_or("all".to_string(), |d: &Vec<String>| d.join(","))
                );
                Some(Devices::Nvml(Box::new(nvml)))
            }
            Err(e) => {
                tracing::info!(
                    "no GPU: NVML is not available ({e}); reporting CPU and memory only"
                );
                None
            }
        };
        Self { nvml, only }
    }

    pub fn present(&self) -> bool {
        self.nvml.is_some()
    }

    /// (mean utilisation %, memory used by `pids`) over the process's devices (all when it was
    /// given none in particular).
    pub fn sample(&self, pids: &[u32]) -> Option<(u32, u64)> {
        let nvml = match self.nvml.as_ref()? {
            Devices::Nvml(nvml) => nvml,
            Devices::StandIn(path) => return self.stand_in(path),
        };
        let count = nvml.device_count().ok()?;
        let (mut util, mut mem, mut n) = (0u32, 0u64, 0u32);
        for i in 0..count {
            let Ok(dev) = nvml.device_by_index(i) else {
                continue;
            };
            if !visible(self.only.as_deref(), i, || dev.uuid().ok()) {
                continue;
            }
            if let Ok(u) = dev.utilization_rates() {
                util += u.gpu;
                n += 1;
            }
            if let Ok(procs) = dev.running_compute_processes() {
                for p in procs.into_iter().filter(|p| pids.contains(&p.pid)) {
                    if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                        mem += b;
                    }
                }
            }
        }
        Some((util / n.max(1), mem))
    }

    /// What the stand-in file says of the devices this process was given; none when it cannot
    /// be read (said in the log).
    fn stand_in(&self, path: &std::path::Path) -> Option<(u32, u64)> {
        let read = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<StandIn>(&b).map_err(|e| e.to_string()));
        let standin = match read {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("the GPU stand-in {}: {e}", path.display());
                return None;
            }
        };
        let (mut util, mut mem, mut n) = (0u32, 0u64, 0u32);
        for (i, d) in standin.devices.iter().enumerate() {
            if visible(self.only.as_deref(), i as u32, || None) {
                util += d.utilisation_pct.min(100);
                mem += d.memory_bytes;
                n += 1;
            }
        }
        Some((util / n.max(1), mem))
    }
}

impl Default for GpuProbe {
    fn default() -> Self {
        Self::new()
    }
}

/// One sample of the process `proc` follows, in the wire form.
pub fn sample(proc: &mut ProcSampler, gpu: &GpuProbe) -> Option<ResourceSample> {
    let (cpu_millicores, rss_bytes) = proc.sample()?;
    let (gpu_utilization_percent, gpu_memory_used_bytes) =
        gpu.sample(&proc.pids()).unwrap_or((0, 0));
    Some(ResourceSample {
        cpu_millicores,
        rss_bytes,
        gpu_present: gpu.present(),
        gpu_utilization_percent,
        gpu_memory_used_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_devices_a_process_was_given_are_sampled() {
        let given = vec!["1".to_string(), "GPU-abcd".to_string()];
        let no_uuid = || None;
        assert!(visible(None, 3, no_uuid));
        assert!(visible(Some(&given), 1, no_uuid));
        assert!(!visible(Some(&given), 0, no_uuid));
        assert!(visible(Some(&given), 0, || Some("GPU-abcd-1234".into())));
        assert!(!visible(Some(&given), 2, || Some("GPU-ffff".into())));
        assert!(
            !visible(Some(&[]), 0, no_uuid),
            "CUDA_VISIBLE_DEVICES= hides all"
        );
    }

    #[test]
    fn samples_a_busy_child_process() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 2000000 ]; do i=$((i+1)); done"])
            .spawn()
            .unwrap();
        let mut s = ProcSampler::new(child.id());
        std::thread::sleep(std::time::Duration::from_millis(300));
        let _ = s.sample().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (cpu, rss) = s.sample().unwrap();
        child.kill().unwrap();
        let _ = child.wait();
        assert!(rss > 100_000, "rss {rss}");
        assert!(
            cpu > 200,
            "a busy loop uses a good part of a core, got {cpu} millicores"
        );
    }

    #[test]
    fn the_stand_in_reports_the_devices_a_process_was_given() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpus.json");
        std::fs::write(
            &path,
            r#"{"devices": [{"utilisation_pct": 30, "memory_bytes": 100},
                            {"utilisation_pct": 50, "memory_bytes": 200}]}"#,
        )
        .unwrap();
        let probe = |only: Option<Vec<String>>| GpuProbe {
            nvml: Some(Devices::StandIn(path.clone())),
            only,
        };
        assert!(probe(None).present());
        assert_eq!(probe(None).sample(&[1]), Some((40, 300)));
        assert_eq!(probe(Some(vec!["1".into()])).sample(&[1]), Some((50, 200)));
        std::fs::write(&path, "{\"devices\": 3}").unwrap();
        assert_eq!(probe(None).sample(&[1]), None);
    }

    #[test]
    fn a_machine_without_nvml_reports_no_gpu_without_error() {
        let gpu = GpuProbe::new();
        if std::path::Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").exists() {
            return; // a GPU machine: the other branch is the one under test here
        }
        assert!(!gpu.present());
        let mut p = ProcSampler::new(std::process::id());
        let s = sample(&mut p, &gpu).unwrap();
        assert!(!s.gpu_present);
        assert!(s.rss_bytes > 0);
    }
}
