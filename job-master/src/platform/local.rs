//! The local platform: each agent is a child process of the job master on this machine, with its
//! output in `RUN_DIR/logs/<role>-<index>.<incarnation>.log`. Agents get SIGTERM if the master
//! dies (PR_SET_PDEATHSIG), so no process outlives the job. A process that asks for `gpu: N` is
//! given N of the machine's GPUs no other live process of the job holds, as its
//! `CUDA_VISIBLE_DEVICES`; one that asks for a share (`gpu: 0.4`) is given one GPU with that
//! much left, shared with other such processes up to one device: the device of its partners
//! when its role shares devices (`placement:` with `share_devices`), else the fullest device
//! with room for its partners' shares too. One that asks for a `gpu_type` the machine's GPUs
//! (by NVML) are not of fails to launch, naming them.

use crate::scale::Capacity;
use crate::spec::{Bytes, Millicores};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::sync::{Mutex, mpsc, watch};

use super::{AgentLaunch, Platform, PlatformEvent};
use crate::error::Error;
use vocab::spec::DeviceShare;
use vocab::{Gpus, SlotKey};

struct Running {
    incarnation: u64,
    pid: u32,
    exited: watch::Receiver<bool>,
    /// The GPUs it was given (freed when it is reaped).
    gpus: Vec<String>,
    /// What it takes of each of them (a whole one, or its share).
    share: Gpus,
}

/// This machine's GPUs as `CUDA_VISIBLE_DEVICES` names them: the job master's own
/// `CUDA_VISIBLE_DEVICES` when set (a share of the machine someone gave it), else every GPU
/// NVML sees (indices), else none.
pub fn machine_gpus() -> Vec<String> {
    if let Ok(v) = std::env::var("CUDA_VISIBLE_DEVICES") {
        return v
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(str::to_string)
            .collect();
    }
    nvml_wrapper::Nvml::init()
        .and_then(|n| n.device_count())
        .map_or(Vec::new(), |n| (0..n).map(|i| i.to_string()).collect())
}

/// The models of this machine's GPUs as NVML names them (`NVIDIA A100-SXM4-40GB`); empty
/// without NVML.
fn machine_gpu_models() -> Vec<String> {
    let Ok(nvml) = nvml_wrapper::Nvml::init() else {
        return Vec::new();
    };
    let n = nvml.device_count().unwrap_or(0);
    (0..n)
        .filter_map(|i| nvml.device_by_index(i).ok()?.name().ok())
        .collect()
}

/// Why a process asking for GPU model `model` cannot run here: none of the machine's GPUs
/// (`models`, NVML's names) is of it (`A100` matches `NVIDIA A100-SXM4-40GB`, any case). Not
/// checked where the models are unknown (no NVML: GPUs named by configuration only).
fn wrong_gpu_model(model: &str, models: &[String]) -> Option<String> {
    let want = model.to_lowercase();
    (!models.is_empty() && !models.iter().any(|m| m.to_lowercase().contains(&want))).then(|| {
        format!(
            "it asks for GPU model {model}; this machine's GPUs are {}",
            models.join(", ")
        )
    })
}

/// `all` GPUs as the reasons name them.
fn listed(all: &[String]) -> String {
    if all.is_empty() {
        "none found: set CUDA_VISIBLE_DEVICES or the local platform's gpus".to_string()
    } else {
        all.join(",")
    }
}

/// The GPUs of `all` a process asking for `need` gets, given what each has given out (`used`,
/// thousandths): whole GPUs that nobody uses, in order; for a share, its partners' device
/// (`partners`: where the live processes it shares a device with run), or else the fullest
/// device with room for `bundle` (its share and its partners'). The reason when none can.
fn pick_gpus(
    all: &[String],
    used: &BTreeMap<String, u32>,
    need: Gpus,
    partners: &[String],
    bundle: Gpus,
) -> Result<Vec<String>, String> {
    let used_of = |d: &String| used.get(d).copied().unwrap_or(0);
    if !need.is_fraction() {
        let free: Vec<String> = all.iter().filter(|d| used_of(d) == 0).cloned().collect();
        let n = need.devices() as usize;
        if free.len() < n {
            return Err(format!(
                "it needs {need} GPU(s); {} of this machine's {} ({}) are free",
                free.len(),
                all.len(),
                listed(all)
            ));
        }
        return Ok(free.into_iter().take(n).collect());
    }
    let left = |d: &String| 1000u32.saturating_sub(used_of(d));
    if let Some(d) = partners.first() {
        return if left(d) >= need.milli() {
            Ok(vec![d.clone()])
        } else {
            Err(format!(
                "it shares GPU {d} with its partners and needs {need} of it; {} is free",
                Gpus::from_milli(left(d))
            ))
        };
    }
    let room = bundle.max(need).milli();
    all.iter()
        .filter(|d| left(d) >= room)
        .max_by_key(|d| (used_of(d), std::cmp::Reverse(*d)))
        .map(|d| vec![d.clone()])
        .ok_or_else(|| {
            format!(
                "it needs {} of one GPU{}; none of this machine's {} ({}) has that free ({})",
                Gpus::from_milli(room),
                if room > need.milli() {
                    format!(" ({need}, and its partners' shares beside it)")
                } else {
                    String::new()
                },
                all.len(),
                listed(all),
                all.iter()
                    .map(|d| format!("{d}: {} free", Gpus::from_milli(left(d))))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

pub struct LocalPlatform {
    agent_bin: PathBuf,
    log_dir: PathBuf,
    events: mpsc::Sender<PlatformEvent>,
    agents: Arc<Mutex<BTreeMap<SlotKey, Running>>>,
    capacity: Capacity,
    gpus: Vec<String>,
    /// The GPUs' models, by NVML (empty without it).
    gpu_models: Vec<String>,
}

impl LocalPlatform {
    pub fn new(
        agent_bin: PathBuf,
        log_dir: PathBuf,
        events: mpsc::Sender<PlatformEvent>,
        max_processes: Option<u32>,
        gpus: Vec<String>,
    ) -> Result<Self, Error> {
        if !agent_bin.is_file() {
            return Err(Error::Launch {
                platform: "local",
                what: "worker agents".into(),
                problem: format!(
                    "the worker-agent binary {} does not exist (build it with `cargo build -p worker-agent`)",
                    agent_bin.display()
                ),
            });
        }
        std::fs::create_dir_all(&log_dir).map_err(|e| Error::Io {
            path: log_dir.clone(),
            source: e,
        })?;
        Ok(Self {
            agent_bin,
            log_dir,
            events,
            agents: Arc::default(),
            capacity: Capacity {
                max_processes: max_processes.unwrap_or(32),
                // Every process runs on this machine: none can be bigger than it.
                cpu: Millicores(
                    std::thread::available_parallelism().map_or(1, |n| n.get()) as u64 * 1000,
                ),
                memory: Bytes(
                    nix::sys::sysinfo::sysinfo()
                        .map(|i| i.ram_total())
                        .unwrap_or(u64::MAX),
                ),
                gpus: gpus.len() as u32,
            },
            gpu_models: if gpus.is_empty() {
                Vec::new()
            } else {
                machine_gpu_models()
            },
            gpus,
        })
    }

    /// The GPUs `key`'s process gets for `need` ([`pick_gpus`]) beside the job's other live
    /// processes (`agents`).
    fn gpus_for(
        &self,
        agents: &BTreeMap<SlotKey, Running>,
        key: SlotKey,
        need: Gpus,
        share: Option<&DeviceShare>,
    ) -> Result<Vec<String>, String> {
        let live = agents
            .iter()
            .filter(|(k, r)| **k != key && !*r.exited.borrow());
        let mut used: BTreeMap<String, u32> = BTreeMap::new();
        for (_, r) in live.clone() {
            for d in &r.gpus {
                *used.entry(d.clone()).or_default() += r.share.milli();
            }
        }
        let partners: Vec<String> = live
            .filter(|(k, _)| share.is_some_and(|s| s.partners.contains(k)))
            .flat_map(|(_, r)| r.gpus.clone())
            .collect();
        let bundle = share.map_or(need, |s| s.bundle);
        pick_gpus(&self.gpus, &used, need, &partners, bundle)
    }

    /// The worker-agent binary beside the running executable, where cargo puts it.
    pub fn default_agent_bin() -> PathBuf {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("worker-agent")))
            .unwrap_or_else(|| PathBuf::from("worker-agent"))
    }
}

async fn terminate(pid: u32, mut exited: watch::Receiver<bool>, grace: Duration) {
    if *exited.borrow() {
        return;
    }
    if !grace.is_zero() {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    }
    if grace.is_zero()
        || tokio::time::timeout(grace, exited.wait_for(|e| *e))
            .await
            .is_err()
    {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let _ = exited.wait_for(|e| *e).await;
    }
}

#[async_trait::async_trait]
impl Platform for LocalPlatform {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn launch(&self, l: AgentLaunch) -> Result<(), Error> {
        self.stop(l.key, Duration::ZERO).await;
        let log_path = self
            .log_dir
            .join(format!("{}.{}.log", l.key, l.incarnation));
        let log = std::fs::File::create(&log_path).map_err(|e| Error::Io {
            path: log_path.clone(),
            source: e,
        })?;
        let log2 = log.try_clone().map_err(|e| Error::Io {
            path: log_path.clone(),
            source: e,
        })?;
        let need = l.resources.as_ref().and_then(|r| r.gpu).unwrap_or_default();
        if let Some(problem) = l
            .resources
            .as_ref()
            .and_then(|r| r.gpu_type.as_deref())
            .filter(|_| !need.is_zero())
            .and_then(|model| wrong_gpu_model(model, &self.gpu_models))
        {
            return Err(Error::Launch {
                platform: "local",
                what: format!("agent {}", l.key),
                problem,
            });
        }
        // Held from the choice of GPUs until the process is listed with them, so that two
        // launches never pick the same room.
        let mut agents = self.agents.lock().await;
        let gpus = if need.is_zero() {
            Vec::new()
        } else {
            self.gpus_for(&agents, l.key, need, l.device_share.as_ref())
                .map_err(|problem| Error::Launch {
                    platform: "local",
                    what: format!("agent {}", l.key),
                    problem,
                })?
        };
        let mut cmd = tokio::process::Command::new(&self.agent_bin);
        if !gpus.is_empty() {
            cmd.env("CUDA_VISIBLE_DEVICES", gpus.join(","));
        }
        if let Some(dir) = &l.tls_dir {
            cmd.env(auth::tls::JOB_TLS_ENV, dir);
        }
        cmd.env(auth::JOB_TOKEN_ENV, &l.token_file)
            .arg("agent")
            .arg("--master")
            .arg(format!("http://{}", l.master_addr))
            .arg("--role")
            .arg(l.key.role.to_string())
            .arg("--index")
            .arg(l.key.index.to_string())
            .arg("--incarnation")
            .arg(l.incarnation.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| Error::Launch {
            platform: "local",
            what: format!("agent {}", l.key),
            problem: format!("{}: {e}", self.agent_bin.display()),
        })?;
        let pid = child.id().unwrap_or(0);
        let (tx, rx) = watch::channel(false);
        agents.insert(
            l.key,
            Running {
                incarnation: l.incarnation,
                pid,
                exited: rx,
                gpus,
                share: need.min(Gpus::ONE),
            },
        );
        drop(agents);
        let events = self.events.clone();
        let agents = self.agents.clone();
        let (key, incarnation) = (l.key, l.incarnation);
        tokio::spawn(async move {
            let status = child.wait().await;
            {
                let mut a = agents.lock().await;
                if a.get(&key)
                    .is_some_and(|r| r.incarnation == incarnation && r.pid == pid)
                {
                    a.remove(&key);
                }
            }
            let _ = tx.send(true);
            let description = match status {
                Ok(s) => s.to_string(),
                Err(e) => format!("wait failed: {e}"),
            };
            let _ = events
                .send(PlatformEvent::AgentExited {
                    key,
                    incarnation,
                    description,
                })
                .await;
        });
        tracing::debug!(%key, incarnation, pid, log = %log_path.display(), "agent launched");
        Ok(())
    }

    async fn stop(&self, key: SlotKey, grace: Duration) {
        // The entry stays until the process is reaped, so `stop_all` still sees an agent whose
        // stop was interrupted.
        let running = self
            .agents
            .lock()
            .await
            .get(&key)
            .map(|r| (r.pid, r.exited.clone()));
        if let Some((pid, exited)) = running {
            terminate(pid, exited, grace).await;
        }
    }

    async fn stop_all(&self, grace: Duration) {
        let all: Vec<(u32, watch::Receiver<bool>)> = self
            .agents
            .lock()
            .await
            .values()
            .map(|r| (r.pid, r.exited.clone()))
            .collect();
        // SIGTERM to all first, so they wind down together; then one grace period for all.
        for (pid, exited) in &all {
            if !*exited.borrow() {
                let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGTERM);
            }
        }
        let deadline = tokio::time::Instant::now() + grace;
        for (pid, exited) in all {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            terminate(pid, exited, left).await;
        }
    }

    fn capacity(&self) -> Capacity {
        self.capacity.clone()
    }

    /// This machine, the one node.
    async fn check_nodes(&self) -> Result<Vec<super::CheckNode>, Error> {
        Ok(vec![super::CheckNode {
            name: "127.0.0.1".into(),
            gpus: self.gpus.len() as u32,
        }])
    }

    /// A child process with its output in `RUN_DIR/logs/<id>.log`, killed at its timeout.
    async fn run_check(
        &self,
        node: &super::CheckNode,
        c: super::CheckLaunch,
    ) -> Result<(), super::CheckEnd> {
        self.run_check_process(node, c)
            .await
            .map_err(super::CheckEnd::Failed)
    }

    async fn running(&self) -> usize {
        self.agents.lock().await.len()
    }
}

impl LocalPlatform {
    /// [`Platform::run_check`]'s process; why it failed.
    async fn run_check_process(
        &self,
        _node: &super::CheckNode,
        c: super::CheckLaunch,
    ) -> Result<(), String> {
        let log_path = self.log_dir.join(format!("{}.log", c.id));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("{}: {e}", log_path.display()))?;
        let (program, args) = c.argv.split_first().ok_or("an empty command line")?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .envs(&c.env)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2))
            .kill_on_drop(true);
        if c.gpus > 0 && !self.gpus.is_empty() {
            let n = (c.gpus as usize).min(self.gpus.len());
            cmd.env("CUDA_VISIBLE_DEVICES", self.gpus[..n].join(","));
        }
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| format!("{program}: {e}"))?;
        let status = match tokio::time::timeout(c.timeout, child.wait()).await {
            Ok(Ok(status)) if status.success() => return Ok(()),
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("wait failed: {e}"),
            Err(_) => {
                let _ = child.kill().await;
                format!("still running after {} s: killed", c.timeout.as_secs())
            }
        };
        let out = std::fs::read_to_string(&log_path).unwrap_or_default();
        Err(format!("{status}; {}", super::last_lines(&out, 8)))
    }
}

#[cfg(test)]
mod tests {
    use super::{BTreeMap, Gpus, pick_gpus, wrong_gpu_model};

    #[test]
    fn a_gpu_model_the_machine_lacks_is_named_with_the_machines() {
        let models = vec!["NVIDIA A100-SXM4-40GB".to_string(), "Tesla T4".to_string()];
        assert_eq!(wrong_gpu_model("A100", &models), None);
        assert_eq!(wrong_gpu_model("t4", &models), None);
        let e = wrong_gpu_model("H100", &models).unwrap();
        assert_eq!(
            e,
            "it asks for GPU model H100; this machine's GPUs are NVIDIA A100-SXM4-40GB, Tesla T4"
        );
        // GPUs named by configuration only: their model is unknown, not checked.
        assert_eq!(wrong_gpu_model("H100", &[]), None);
    }

    fn used(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(d, m)| (d.to_string(), *m)).collect()
    }

    #[test]
    fn gpus_go_to_one_process_at_a_time_and_too_few_are_named() {
        let all: Vec<String> = ["0", "1", "2"].map(String::from).to_vec();
        let two = Gpus::whole(2);
        assert_eq!(
            pick_gpus(&all, &used(&[]), two, &[], two).unwrap(),
            ["0", "1"]
        );
        let zero_taken = used(&[("0", 1000)]);
        assert_eq!(
            pick_gpus(&all, &zero_taken, two, &[], two).unwrap(),
            ["1", "2"]
        );
        // A device shared at all is not free for a whole-GPU process.
        let e = pick_gpus(&all, &used(&[("0", 1000), ("2", 300)]), two, &[], two).unwrap_err();
        assert_eq!(
            e,
            "it needs 2 GPU(s); 1 of this machine's 3 (0,1,2) are free"
        );
        let e = pick_gpus(&[], &used(&[]), Gpus::ONE, &[], Gpus::ONE).unwrap_err();
        assert!(e.contains("none found"), "{e}");
    }

    #[test]
    fn shares_of_a_gpu_pack_onto_one_device_beside_their_partners() {
        let all: Vec<String> = ["0", "1"].map(String::from).to_vec();
        let (share, none) = (Gpus::from_milli(400), &[] as &[String]);
        // The fullest device with room: 1 (0.5 used) before 0 (free).
        let on = used(&[("1", 500)]);
        assert_eq!(pick_gpus(&all, &on, share, none, share).unwrap(), ["1"]);
        // With room for its partners too (0.4 + 0.6): only the free device holds them.
        assert_eq!(pick_gpus(&all, &on, share, none, Gpus::ONE).unwrap(), ["0"]);
        // Beside a partner that runs: its device, or the reason.
        let partner = ["1".to_string()];
        assert_eq!(
            pick_gpus(&all, &on, share, &partner, Gpus::ONE).unwrap(),
            ["1"]
        );
        let e = pick_gpus(&all, &used(&[("1", 700)]), share, &partner, Gpus::ONE).unwrap_err();
        assert_eq!(
            e,
            "it shares GPU 1 with its partners and needs 0.4 of it; 0.3 is free"
        );
        let e = pick_gpus(&all, &used(&[("0", 700), ("1", 800)]), share, none, share).unwrap_err();
        assert_eq!(
            e,
            "it needs 0.4 of one GPU; none of this machine's 2 (0,1) has that free (0: 0.3 \
             free, 1: 0.2 free)"
        );
    }
}
