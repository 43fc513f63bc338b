//! Rates of the calls between a job's roles: what each role served and how long its callers
//! waited for it, over the last [`WINDOW_MS`]. The SDK's processes report running totals
//! (`ReportCalls`); the master keeps each process's last totals, adds what each report adds to
//! per-role sums, and samples the sums, so that a rate is a difference over the window. A
//! restarted process (a new incarnation) starts its totals from zero. A share (of time busy,
//! of time waiting) is of the time each process took part within the window, from its first
//! report: one that began within it (a new engine, a worker still importing its framework when
//! the window began) is not counted idle before that. A process removed, and one of its index
//! added again later, is counted from the first one's start, so its share reads low. Not
//! persisted: rates start again after a master restart.
//!
//! These figures are what the brain gives capacity by (a role whose callers spend their time
//! waiting for it is the one that bounds the job), and what `job-master status` shows.

use std::collections::{BTreeMap, VecDeque};

use vocab::{Role, SlotKey};

/// The window rates are measured over.
pub const WINDOW_MS: u64 = 30_000;
/// A rate needs at least this much of a window.
const MIN_SPAN_MS: u64 = 2_000;
/// How often the SDK's processes report: a process's first report covers about this much
/// before it.
const REPORT_EVERY_MS: u64 = 1_000;

/// One process's running totals, as its last report gave them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallTotals {
    /// Calls it made and seconds it waited in them, by the role called.
    pub calls: BTreeMap<Role, (u64, f64)>,
    pub served: u64,
    pub busy_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Sums {
    served: u64,
    busy_s: f64,
    calls_in: u64,
    waited_s: f64,
    /// `waited_s` by the callers' role.
    waited_by: BTreeMap<Role, f64>,
}

/// One role's rates over the window.
#[derive(Clone, Debug, PartialEq)]
pub struct RoleRate {
    pub role: Role,
    /// Its processes that served in the window.
    pub processes: u32,
    pub served_per_s: f64,
    /// Share of its serving processes' time spent serving.
    pub busy_share: f64,
    /// Share of its callers' time spent waiting in calls to it.
    pub callers_wait_share: f64,
    pub callers: u32,
    /// The same by the callers' role: (role, share of its calling processes' time spent
    /// waiting in calls to this one, how many called), in role order.
    pub by_caller: Vec<(Role, f64, u32)>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallRates {
    last: BTreeMap<SlotKey, (u64, CallTotals)>,
    sums: BTreeMap<Role, Sums>,
    samples: VecDeque<(u64, BTreeMap<Role, Sums>)>,
    /// When each process last served, and last called each role.
    served_at: BTreeMap<SlotKey, u64>,
    called_at: BTreeMap<(Role, SlotKey), u64>,
    /// Since when each process (by role and index: a restart's successor goes on) is counted,
    /// from its first report: a share is of the time it was there, not of a window that began
    /// before it took part.
    present_since: BTreeMap<SlotKey, u64>,
}

impl CallRates {
    /// Folds in `key`'s totals (of `incarnation`) at `now_ms`.
    pub fn record(&mut self, key: SlotKey, incarnation: u64, t: CallTotals, now_ms: u64) {
        let zero = CallTotals::default();
        self.present_since
            .entry(key)
            .or_insert_with(|| now_ms.saturating_sub(REPORT_EVERY_MS));
        let prev = match self.last.get(&key) {
            Some((inc, p)) if *inc == incarnation => p,
            _ => &zero,
        };
        // A total below the last one (it should not happen) counts from zero.
        let du = |new: u64, old: u64| if new >= old { new - old } else { new };
        let df = |new: f64, old: f64| if new >= old { new - old } else { new };
        let own = self.sums.entry(key.role).or_default();
        let served = du(t.served, prev.served);
        own.served += served;
        own.busy_s += df(t.busy_s, prev.busy_s);
        if served > 0 {
            self.served_at.insert(key, now_ms);
        }
        for (callee, &(calls, waited)) in &t.calls {
            let (pc, pw) = prev.calls.get(callee).copied().unwrap_or((0, 0.0));
            let s = self.sums.entry(*callee).or_default();
            let n = du(calls, pc);
            s.calls_in += n;
            let w = df(waited, pw);
            s.waited_s += w;
            *s.waited_by.entry(key.role).or_default() += w;
            if n > 0 {
                self.called_at.insert((*callee, key), now_ms);
            }
        }
        self.last.insert(key, (incarnation, t));
        self.samples.push_back((now_ms, self.sums.clone()));
        // Keep one sample at or before the window's start, as the base of its differences.
        while self.samples.len() > 1 && self.samples[1].0 + WINDOW_MS <= now_ms {
            self.samples.pop_front();
        }
    }

    /// How much of the window ending at `now_ms` the rates cover: from the first report
    /// folded in, at most [`WINDOW_MS`]; 0 before any.
    pub fn cover_ms(&self, now_ms: u64) -> u64 {
        self.samples
            .front()
            .map_or(0, |(at, _)| now_ms.saturating_sub(*at).min(WINDOW_MS))
    }

    /// Each role's rates over the window that ends at `now_ms` (roles that served or were
    /// called in it), in role order.
    pub fn rates(&self, now_ms: u64) -> Vec<RoleRate> {
        let Some((base_at, base)) = self.samples.front() else {
            return Vec::new();
        };
        let span = now_ms.saturating_sub(*base_at).min(WINDOW_MS);
        if span < MIN_SPAN_MS {
            return Vec::new();
        }
        let dt = span as f64 / 1000.0;
        let since = now_ms.saturating_sub(WINDOW_MS);
        // Seconds of the window process `k` was there (a process that started within it is
        // not counted idle before its start); never under the shortest span a rate needs.
        let start = now_ms - span;
        let present = |k: &SlotKey| {
            let from = self.present_since.get(k).copied().unwrap_or(start);
            now_ms.saturating_sub(from.max(start)).max(MIN_SPAN_MS) as f64 / 1000.0
        };
        let mut out = Vec::new();
        let none = Sums::default();
        for (role, now) in &self.sums {
            let then = base.get(role).unwrap_or(&none);
            let servers: Vec<&SlotKey> = self
                .served_at
                .iter()
                .filter(|(k, at)| k.role == *role && **at >= since)
                .map(|(k, _)| k)
                .collect();
            let calling: Vec<&SlotKey> = self
                .called_at
                .iter()
                .filter(|((callee, _), at)| callee == role && **at >= since)
                .map(|((_, k), _)| k)
                .collect();
            if servers.is_empty() && calling.is_empty() {
                continue;
            }
            // `x` seconds over the time `keys` were there.
            let share = |x: f64, keys: &[&SlotKey]| {
                let there: f64 = keys.iter().map(|k| present(k)).sum();
                (x / there.max(MIN_SPAN_MS as f64 / 1000.0)).clamp(0.0, 1.0)
            };
            let by_caller = now
                .waited_by
                .iter()
                .filter_map(|(caller, waited)| {
                    let of_role: Vec<&SlotKey> = calling
                        .iter()
                        .copied()
                        .filter(|k| k.role == *caller)
                        .collect();
                    let before = then.waited_by.get(caller).copied().unwrap_or(0.0);
                    let n = of_role.len() as u32;
                    (n > 0).then(|| (*caller, share(waited - before, &of_role), n))
                })
                .collect();
            out.push(RoleRate {
                role: *role,
                processes: servers.len() as u32,
                served_per_s: (now.served - then.served) as f64 / dt,
                busy_share: share(now.busy_s - then.busy_s, &servers),
                callers_wait_share: share(now.waited_s - then.waited_s, &calling),
                callers: calling.len() as u32,
                by_caller,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(role: &str, index: u32) -> SlotKey {
        SlotKey {
            role: role.parse().unwrap(),
            index,
        }
    }

    fn caller(calls: u64, waited: f64) -> CallTotals {
        CallTotals {
            calls: [("rollout".parse().unwrap(), (calls, waited))].into(),
            ..Default::default()
        }
    }

    fn server(served: u64, busy: f64) -> CallTotals {
        CallTotals {
            served,
            busy_s: busy,
            ..Default::default()
        }
    }

    #[test]
    fn rates_are_differences_over_the_window_and_a_restart_counts_from_zero() {
        let mut r = CallRates::default();
        let (w, e0, e1) = (key("worker", 0), key("rollout", 0), key("rollout", 1));
        // Over 10 s: the worker waits 8 s in 50 calls; the two engines serve 25 each, busy 4 s.
        r.record(w, 1, caller(0, 0.0), 0);
        r.record(e0, 1, server(0, 0.0), 0);
        r.record(e1, 1, server(0, 0.0), 0);
        r.record(w, 1, caller(50, 8.0), 10_000);
        r.record(e0, 1, server(25, 4.0), 10_000);
        r.record(e1, 1, server(25, 4.0), 10_000);
        let rates = r.rates(10_000);
        assert_eq!(rates.len(), 1, "{rates:?}");
        let x = &rates[0];
        assert_eq!(
            (x.role, x.processes, x.callers),
            ("rollout".parse().unwrap(), 2, 1)
        );
        assert!((x.served_per_s - 5.0).abs() < 1e-9, "{x:?}");
        assert!((x.busy_share - 0.4).abs() < 1e-9, "{x:?}");
        assert!((x.callers_wait_share - 0.8).abs() < 1e-9, "{x:?}");
        // Engine 1 restarts: its new totals count from zero, not as a fall.
        r.record(e1, 2, server(5, 1.0), 12_000);
        let x = &r.rates(12_000)[0];
        assert!((x.served_per_s - 55.0 / 12.0).abs() < 1e-9, "{x:?}");
        // Long after, the window has moved past everything: nobody served or called in it.
        r.record(w, 1, caller(50, 8.0), 60_000);
        assert!(r.rates(60_000).is_empty());
        // Too short a window says nothing.
        assert!(CallRates::default().rates(1_000).is_empty());
    }

    #[test]
    fn the_rates_cover_the_window_from_the_first_report_on() {
        let mut r = CallRates::default();
        assert_eq!(r.cover_ms(5_000), 0, "no report yet");
        r.record(key("worker", 0), 1, caller(1, 0.5), 5_000);
        assert_eq!(r.cover_ms(5_000), 0);
        assert_eq!(r.cover_ms(17_000), 12_000);
        r.record(key("worker", 0), 1, caller(9, 4.0), 40_000);
        assert_eq!(r.cover_ms(40_000), WINDOW_MS, "at most the window");
        r.record(key("worker", 0), 1, caller(20, 9.0), 90_000);
        assert_eq!(r.cover_ms(90_000), WINDOW_MS, "reports go on: still whole");
    }

    /// Seen on a loaded CI machine: the workers began calling 15 s into the window (their
    /// framework imports took that long), and over the whole window their wait looked like a
    /// quarter of their time, though they waited all of it once there; the brain grew them.
    #[test]
    fn a_process_that_started_within_the_window_is_counted_from_its_start() {
        let mut r = CallRates::default();
        let (d, w, e0, e1) = (
            key("driver", 0),
            key("worker", 0),
            key("rollout", 0),
            key("rollout", 1),
        );
        r.record(d, 1, caller(0, 0.0), 0);
        r.record(e0, 1, server(0, 0.0), 0);
        // The driver waits half its time from the start; the worker, from its first report at
        // 16 s (covering the second before it), all of it.
        r.record(w, 1, caller(10, 1.0), 16_000);
        r.record(d, 1, caller(100, 10.0), 20_000);
        r.record(w, 1, caller(50, 5.0), 20_000);
        // An engine added at 18 s is busy all its time; the first, half of the window.
        r.record(e1, 1, server(20, 2.0), 19_000);
        r.record(e1, 1, server(40, 3.0), 20_000);
        r.record(e0, 1, server(200, 10.0), 20_000);
        let x = &r.rates(20_000)[0];
        let by: BTreeMap<String, f64> = x
            .by_caller
            .iter()
            .map(|(role, share, _)| (role.to_string(), *share))
            .collect();
        assert!((by["worker"] - 1.0).abs() < 1e-9, "{by:?}");
        assert!((by["driver"] - 0.5).abs() < 1e-9, "{by:?}");
        // 15 s waited over the 25 s the two callers were there.
        assert!((x.callers_wait_share - 0.6).abs() < 1e-9, "{x:?}");
        // 13 s busy over the 22 s the two engines were there.
        assert!((x.busy_share - 13.0 / 22.0).abs() < 1e-9, "{x:?}");
        let worker = |r: &CallRates, now: u64| {
            r.rates(now)[0]
                .by_caller
                .iter()
                .find(|b| b.0.to_string() == "worker")
                .map(|b| b.1)
        };
        // A quick restart's successor goes on counting from its predecessor's start: 5.5 s
        // waited over the 6 s the worker was there.
        r.record(w, 2, caller(5, 0.5), 21_000);
        let share = worker(&r, 21_000).unwrap();
        assert!((share - 5.5 / 6.0).abs() < 1e-9, "{share}");
    }

    #[test]
    fn each_callers_role_has_its_own_wait() {
        let mut r = CallRates::default();
        let (w0, w1, d, e) = (
            key("worker", 0),
            key("worker", 1),
            key("driver", 0),
            key("rollout", 0),
        );
        for k in [w0, w1, d] {
            r.record(k, 1, caller(0, 0.0), 0);
        }
        r.record(e, 1, server(0, 0.0), 0);
        // Over 10 s the two workers wait 8 s and 6 s for the engine, the driver 1 s.
        r.record(w0, 1, caller(40, 8.0), 10_000);
        r.record(w1, 1, caller(30, 6.0), 10_000);
        r.record(d, 1, caller(5, 1.0), 10_000);
        r.record(e, 1, server(75, 9.0), 10_000);
        let x = &r.rates(10_000)[0];
        assert_eq!(x.callers, 3, "{x:?}");
        assert!((x.callers_wait_share - 0.5).abs() < 1e-9, "{x:?}");
        let by: Vec<(String, f64, u32)> = x
            .by_caller
            .iter()
            .map(|(role, share, n)| (role.to_string(), *share, *n))
            .collect();
        assert_eq!(by.len(), 2, "{by:?}");
        assert_eq!((by[0].0.as_str(), by[0].2), ("driver", 1), "{by:?}");
        assert!((by[0].1 - 0.1).abs() < 1e-9, "{by:?}");
        assert_eq!((by[1].0.as_str(), by[1].2), ("worker", 2), "{by:?}");
        assert!((by[1].1 - 0.7).abs() < 1e-9, "{by:?}");
    }
}
