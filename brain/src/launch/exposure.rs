//! What a confined job could reach on the brain's host that would take it out of its sandbox.
//! The sandbox shares the host's network, so a job's process reaches every service listening
//! there, loopback included. Most ask for a credential; a Ray dashboard without one runs
//! whatever it is given (a Ray job) as its own user, outside the sandbox. A brain that runs
//! its jobs as another user refuses to start beside such a dashboard on a loopback address it
//! knows of (Ray's default, and its own `cluster.ray_address`), unless the operator accepts it
//! (`[launcher] allow_open_ray_dashboard`).

use std::net::IpAddr;
use std::time::Duration;

use super::LauncherConfig;
use crate::BrainError;

/// Where Ray's dashboard listens unless told otherwise.
pub const RAY_DEFAULT_DASHBOARD: &str = "http://127.0.0.1:8265";

/// How long a dashboard has to answer the probe: one on loopback answers at once, and
/// anything else listening there is not held on to.
const PROBE_WITHIN: Duration = Duration::from_secs(3);

/// Refuses to start, saying why, when the jobs run confined as another user and a Ray
/// dashboard answers without a credential on a loopback address of [`known_dashboards`].
pub async fn refuse_open_dashboards(
    config: &LauncherConfig,
    ray_address: Option<&str>,
) -> Result<(), BrainError> {
    if config.sandbox.run_as.is_none() || config.allow_open_ray_dashboard {
        return Ok(());
    }
    for url in known_dashboards(ray_address) {
        if let Some(version) = answers_without_credential(&url).await {
            return Err(BrainError::Config(format!(
                "a Ray dashboard answers without a credential at {url} (Ray {version}): the \
                 jobs' processes share this host's network, so any of them could submit a Ray \
                 job there and run outside its sandbox as the dashboard's user. Give the \
                 dashboard authentication, run it on another host, or stop it; to accept \
                 this, set [launcher] allow_open_ray_dashboard = true \
                 (brain --allow-open-ray-dashboard)"
            )));
        }
    }
    Ok(())
}

/// The dashboards on loopback the brain knows of: Ray's default, and `ray_address` when it is
/// on loopback.
pub fn known_dashboards(ray_address: Option<&str>) -> Vec<String> {
    let mut known = vec![RAY_DEFAULT_DASHBOARD.to_string()];
    if let Some(a) = ray_address.filter(|a| on_loopback(a)) {
        let url = if a.contains("://") {
            a.trim_end_matches('/').to_string()
        } else {
            format!("http://{}", a.trim_end_matches('/'))
        };
        if !known.contains(&url) {
            known.push(url);
        }
    }
    known
}

/// Whether `address` (`http://HOST:PORT` or `HOST:PORT`) names this host's loopback.
fn on_loopback(address: &str) -> bool {
    let url = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let Ok(url) = reqwest::Url::parse(&url) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Ray's version when a dashboard at `url` tells it to anyone: one with authentication
/// refuses, and where none listens nothing answers.
async fn answers_without_credential(url: &str) -> Option<String> {
    let api = ray_client::RayApi::new(url).ok()?;
    tokio::time::timeout(PROBE_WITHIN, api.version())
        .await
        .ok()?
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_known_dashboards_are_ray_s_default_and_the_brain_s_own_on_loopback() {
        assert_eq!(known_dashboards(None), [RAY_DEFAULT_DASHBOARD]);
        assert_eq!(
            known_dashboards(Some("127.0.0.1:40123")),
            [RAY_DEFAULT_DASHBOARD, "http://127.0.0.1:40123"]
        );
        assert_eq!(
            known_dashboards(Some("http://localhost:9000/")),
            [RAY_DEFAULT_DASHBOARD, "http://localhost:9000"]
        );
        assert_eq!(
            known_dashboards(Some("http://[::1]:9000")),
            [RAY_DEFAULT_DASHBOARD, "http://[::1]:9000"]
        );
        // Another host's is not the sandbox's loopback (and is said plainly in the docs).
        assert_eq!(
            known_dashboards(Some("http://10.0.0.5:8265")),
            [RAY_DEFAULT_DASHBOARD]
        );
        assert_eq!(
            known_dashboards(Some("127.0.0.1:8265")),
            [RAY_DEFAULT_DASHBOARD]
        );
    }
}
