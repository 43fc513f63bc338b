//! Rate limits per client (`[limits]`), so that one flooding client cannot starve the others'
//! ingest: what it sends beyond its rate is refused with RESOURCE_EXHAUSTED (and the time to
//! wait) before it touches the store. Three keyed limiters (governor's GCRA, one state per key):
//!
//! * `calls_per_second`: every RPC, per [`Client`] (the operator, one job's secret, or under
//!   `--insecure` one connection), checked by [`Throttle::interceptor`] after [`crate::auth`];
//! * `reports_per_second`: metric reports per job (a batch of 100 counts 100), in
//!   `ReportMetrics`; a whole batch always fits the burst;
//! * `submissions_per_minute`: `SubmitJob` per client (under `--insecure` per peer address);
//! * `sign_ins_per_minute`: console sign-ins per peer address, right or wrong.
//!
//! 0 turns a limit off. Refusals are counted in `brain_throttled_total{limit}`.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, NotUntil, Quota, RateLimiter};
use tonic::{Request, Status};

use crate::auth::{self, Caller};
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::store::JobId;

/// Whom a limit counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    Operator,
    Job(JobId),
    /// A job's owner (a person, counted apart from the job's master).
    Owner(JobId),
    /// A caller of an insecure brain, by its connection (calls) or its address (submissions).
    Connection(Option<SocketAddr>),
    Address(Option<IpAddr>),
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Operator => write!(f, "the operator"),
            Client::Job(j) => write!(f, "{j}"),
            Client::Owner(j) => write!(f, "the owner of {j}"),
            Client::Connection(Some(a)) => write!(f, "the connection from {a}"),
            Client::Address(Some(a)) => write!(f, "{a}"),
            Client::Connection(None) | Client::Address(None) => write!(f, "this caller"),
        }
    }
}

/// The client a call counts against for its calls (`per_connection`) or its submissions.
fn client_of<T>(request: &Request<T>, per_connection: bool) -> Result<Client, Status> {
    Ok(match auth::caller(request)? {
        Caller::Operator => Client::Operator,
        Caller::Job(j) => Client::Job(j),
        Caller::Owner(j) => Client::Owner(j),
        Caller::Anyone if per_connection => Client::Connection(request.remote_addr()),
        Caller::Anyone => Client::Address(request.remote_addr().map(|a| a.ip())),
    })
}

/// How many keys a limiter holds before it forgets those that are back to a full burst.
const KEYS_KEPT: usize = 4096;

struct Limit<K: std::hash::Hash + Eq + Clone> {
    /// `limits.<name>`, as refusals and metrics name it.
    name: &'static str,
    per: &'static str,
    rate: u32,
    limiter: DefaultKeyedRateLimiter<K>,
    checks: AtomicU64,
}

impl<K: std::hash::Hash + Eq + Clone> Limit<K> {
    fn new(name: &'static str, rate: u32, burst: u32, per_minute: bool) -> Option<Self> {
        let rate_nz = NonZeroU32::new(rate)?;
        let quota = if per_minute {
            Quota::per_minute(rate_nz)
        } else {
            Quota::per_second(rate_nz)
        };
        let burst = NonZeroU32::new(burst.max(rate)).unwrap_or(rate_nz);
        Some(Limit {
            name,
            per: if per_minute { "minute" } else { "second" },
            rate,
            limiter: RateLimiter::keyed(quota.allow_burst(burst)),
            checks: AtomicU64::new(0),
        })
    }

    /// Takes `n` of `key`'s allowance, or says how long to wait.
    fn take(&self, key: &K, n: u32, who: impl std::fmt::Display) -> Result<(), Status> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % 1024 == 1023
            && self.limiter.len() > KEYS_KEPT
        {
            self.limiter.retain_recent();
        }
        let Some(n) = NonZeroU32::new(n) else {
            return Ok(());
        };
        let refused = |wait: std::time::Duration| {
            Status::resource_exhausted(format!(
                "{who} is over limits.{} ({} per {}): try again in {} ms",
                self.name,
                self.rate,
                self.per,
                wait.as_millis().max(1)
            ))
        };
        match self.limiter.check_key_n(key, n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(refused(wait(&not_until))),
            // More at once than the burst: never allowed (the batch limit keeps this out).
            Err(_) => Err(Status::invalid_argument(format!(
                "{n} at once is more than limits.{} allows in a burst",
                self.name
            ))),
        }
    }
}

fn wait(not_until: &NotUntil<<DefaultClock as Clock>::Instant>) -> std::time::Duration {
    not_until.wait_time_from(DefaultClock::default().now())
}

/// The brain's rate limits, shared by its interceptor and its handlers.
pub struct Throttle {
    calls: Option<Limit<Client>>,
    reports: Option<Limit<JobId>>,
    submissions: Option<Limit<Client>>,
    sign_ins: Option<Limit<Option<IpAddr>>>,
    metrics: std::sync::Arc<Metrics>,
}

impl Throttle {
    pub fn new(limits: &Limits, metrics: std::sync::Arc<Metrics>) -> Throttle {
        let t = Throttle {
            calls: Limit::new(
                "calls_per_second",
                limits.calls_per_second,
                limits.calls_per_second,
                false,
            ),
            // A whole batch fits the burst, so a job master's backlog drains batch by batch.
            reports: Limit::new(
                "reports_per_second",
                limits.reports_per_second,
                proto::MAX_REPORTS_PER_BATCH as u32,
                false,
            ),
            submissions: Limit::new(
                "submissions_per_minute",
                limits.submissions_per_minute,
                limits.submissions_per_minute,
                true,
            ),
            sign_ins: Limit::new(
                "sign_ins_per_minute",
                limits.sign_ins_per_minute,
                limits.sign_ins_per_minute,
                true,
            ),
            metrics,
        };
        // Each limit's refusals count from 0, so that a rate() over them is defined before
        // the first refusal.
        for limit in [
            "calls_per_second",
            "reports_per_second",
            "submissions_per_minute",
            "sign_ins_per_minute",
        ] {
            t.metrics.throttled_count(limit);
        }
        t
    }

    fn counted<T>(&self, limit: &'static str, r: Result<T, Status>) -> Result<T, Status> {
        if r.is_err() {
            self.metrics.throttled(limit);
        }
        r
    }

    /// One call by the request's client (run after [`crate::auth`]'s interceptor).
    pub fn call<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(l) = &self.calls else {
            return Ok(());
        };
        let client = client_of(request, true)?;
        self.counted(l.name, l.take(&client, 1, client))
    }

    /// `n` metric reports of `job`.
    pub fn reports(&self, job: JobId, n: usize) -> Result<(), Status> {
        let Some(l) = &self.reports else {
            return Ok(());
        };
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.counted(l.name, l.take(&job, n, job))
    }

    /// One submission by the request's client.
    pub fn submission<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(l) = &self.submissions else {
            return Ok(());
        };
        let client = client_of(request, false)?;
        self.counted(l.name, l.take(&client, 1, client))
    }

    /// One console sign-in from `address` (whatever its token).
    pub fn sign_in(&self, address: Option<IpAddr>) -> Result<(), Status> {
        let Some(l) = &self.sign_ins else {
            return Ok(());
        };
        let who = address.map_or_else(|| "this address".to_string(), |a| a.to_string());
        self.counted(l.name, l.take(&address, 1, who))
    }

    /// The server interceptor that counts every call (inside the authenticating one).
    pub fn interceptor(
        self: std::sync::Arc<Self>,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
        move |request: Request<()>| {
            self.call(&request)?;
            Ok(request)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tonic::Code;

    fn throttle(calls: u32, reports: u32, submissions: u32) -> Throttle {
        let limits = Limits {
            calls_per_second: calls,
            reports_per_second: reports,
            submissions_per_minute: submissions,
            ..Limits::default()
        };
        Throttle::new(&limits, Arc::new(Metrics::default()))
    }

    fn as_caller(caller: Caller) -> Request<()> {
        let mut r = Request::new(());
        r.extensions_mut().insert(caller);
        r
    }

    #[test]
    fn a_client_over_its_rate_is_refused_and_others_are_not() {
        let t = throttle(5, 0, 0);
        let flooder = as_caller(Caller::Job(JobId(1)));
        let other = as_caller(Caller::Job(JobId(2)));
        let passed = (0..50).filter(|_| t.call(&flooder).is_ok()).count();
        // The burst (a second's worth), and at most a call or two the clock let in meanwhile.
        assert!((5..=7).contains(&passed), "{passed}");
        let e = t.call(&flooder).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert!(
            e.message()
                .contains("job 1 is over limits.calls_per_second (5 per second)"),
            "{e:?}"
        );
        assert!(e.message().contains("try again in"), "{e:?}");
        for _ in 0..5 {
            t.call(&other).unwrap();
        }
        t.call(&as_caller(Caller::Operator)).unwrap();
        assert!(t.metrics.throttled_count("calls_per_second") >= 1);
    }

    #[test]
    fn a_whole_batch_of_reports_fits_and_a_job_s_reports_count_alone() {
        let t = throttle(0, 10, 0);
        t.reports(JobId(1), proto::MAX_REPORTS_PER_BATCH).unwrap();
        let e = t.reports(JobId(1), 1).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert!(
            e.message().contains("reports_per_second (10 per second)"),
            "{e:?}"
        );
        t.reports(JobId(2), 10).unwrap();
        t.reports(JobId(2), 0).unwrap();
    }

    #[test]
    fn submissions_count_per_minute_and_zero_is_no_limit() {
        let t = throttle(0, 0, 2);
        let op = as_caller(Caller::Operator);
        t.submission(&op).unwrap();
        t.submission(&op).unwrap();
        let e = t.submission(&op).unwrap_err();
        assert!(
            e.message()
                .contains("the operator is over limits.submissions_per_minute (2 per minute)"),
            "{e:?}"
        );
        let free = throttle(0, 0, 0);
        for _ in 0..10_000 {
            free.call(&op).unwrap();
            free.reports(JobId(1), 1000).unwrap();
            free.submission(&op).unwrap();
        }
    }

    #[test]
    fn an_unauthenticated_request_is_not_counted_but_refused() {
        let t = throttle(5, 0, 0);
        let e = t.call(&Request::new(())).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
    }
}
