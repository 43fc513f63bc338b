//! Who may call the brain. Every call carries a bearer token ([`auth`]); the interceptor
//! [`Keys::interceptor`] turns it into a [`Caller`] on the request, or answers UNAUTHENTICATED:
//!
//! * the **operator token**, created at the brain's first start in an owner-only file
//!   (`operator_token_file`, default beside the database), which `brainctl` reads: submit, scale,
//!   cancel, policy, plans, the job list;
//! * a **job's secret**, minted when the brain starts the job's master (handed over in an
//!   owner-only file in its run directory, its path in argv, never the secret) or when an
//!   operator registers a job master started by hand (returned once in `RegisterJobResponse`):
//!   what a job master does for its own job only (register under its name, report metrics and
//!   its outcome, fetch and acknowledge plans, read its record). Another job's id is
//!   PERMISSION_DENIED. The brain keeps only the secrets' SHA-256, in its store;
//! * the **metrics token** (`metrics.token` beside the database): `GET /metrics` only (the
//!   operator token is taken there too), so a Prometheus server holds no power over jobs.
//!
//! Handlers check the caller with [`operator`], [`job_itself`] and [`operator_or_job`]. A brain
//! started `--insecure` checks no token: every caller is [`Caller::Anyone`] and may do
//! everything.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use auth::Token;
use tonic::{Request, Status};

use crate::store::JobId;

/// Who called, as the interceptor established it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Job(JobId),
    /// Anyone at all: the brain runs `--insecure`.
    Anyone,
}

/// The tokens the brain accepts.
pub struct Keys {
    /// `None`: insecure, no token is checked.
    operator: Option<Token>,
    jobs: RwLock<HashMap<[u8; 32], JobId>>,
    /// The scrapers' token for `GET /metrics`, which may do nothing else.
    scraper: Option<Token>,
}

impl Keys {
    pub fn new(operator: Token, jobs: impl IntoIterator<Item = ([u8; 32], JobId)>) -> Keys {
        Keys {
            operator: Some(operator),
            jobs: RwLock::new(jobs.into_iter().collect()),
            scraper: None,
        }
    }

    /// These keys with `token` taken for `GET /metrics` (besides the operator token).
    pub fn scraped_with(mut self, token: Token) -> Keys {
        self.scraper = Some(token);
        self
    }

    /// Whether a presented token may read `GET /metrics`: the scrapers' or the operator's
    /// (anyone's on an insecure brain; never a job's secret).
    pub fn may_scrape(&self, presented: Option<&str>) -> bool {
        let Some(operator) = &self.operator else {
            return true;
        };
        presented.is_some_and(|p| {
            operator.matches(p) || self.scraper.as_ref().is_some_and(|s| s.matches(p))
        })
    }

    /// A job's secret from now on (its digest is in the store already).
    pub fn add(&self, digest: [u8; 32], job: JobId) {
        self.jobs
            .write()
            .expect("no panic under the lock")
            .insert(digest, job);
    }

    /// Keys that let everyone through (`--insecure`).
    pub fn insecure() -> Keys {
        Keys {
            operator: None,
            jobs: RwLock::default(),
            scraper: None,
        }
    }

    /// The caller a presented token makes.
    pub fn caller(&self, presented: Option<&str>) -> Result<Caller, Status> {
        let Some(operator) = &self.operator else {
            return Ok(Caller::Anyone);
        };
        let Some(presented) = presented else {
            return Err(Status::unauthenticated(
                "no token: the brain needs `authorization: Bearer TOKEN` (brainctl reads the \
                 operator token from --token-file, default brain-data/operator.token)",
            ));
        };
        if operator.matches(presented) {
            return Ok(Caller::Operator);
        }
        let digest = auth::digest_of(presented);
        self.jobs
            .read()
            .expect("no panic under the lock")
            .get(&digest)
            .map(|&job| Caller::Job(job))
            .ok_or_else(|| Status::unauthenticated("the token is not one this brain gave"))
    }

    /// The server interceptor: sets the [`Caller`] on every request it lets through.
    pub fn interceptor(
        self: Arc<Self>,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
        move |mut request: Request<()>| {
            let caller = self.caller(auth::bearer(&request))?;
            request.extensions_mut().insert(caller);
            Ok(request)
        }
    }
}

/// Who made the call, as the interceptor established it.
pub fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .copied()
        .ok_or_else(|| Status::unauthenticated("the call was not authenticated"))
}

/// Operator calls only.
pub fn operator<T>(request: &Request<T>) -> Result<(), Status> {
    match caller(request)? {
        Caller::Operator | Caller::Anyone => Ok(()),
        Caller::Job(j) => Err(Status::permission_denied(format!(
            "the secret of {j} cannot make operator calls"
        ))),
    }
}

/// Calls a job makes for itself only.
pub fn job_itself<T>(request: &Request<T>, job: JobId) -> Result<(), Status> {
    match caller(request)? {
        Caller::Job(j) if j == job => Ok(()),
        Caller::Anyone => Ok(()),
        Caller::Job(j) => Err(Status::permission_denied(format!(
            "the secret of {j} cannot act on {job}"
        ))),
        Caller::Operator => Err(Status::permission_denied(format!(
            "only the job master of {job} makes this call, with its job's secret"
        ))),
    }
}

/// The operator, or the job itself.
pub fn operator_or_job<T>(request: &Request<T>, job: JobId) -> Result<(), Status> {
    match caller(request)? {
        Caller::Operator | Caller::Anyone => Ok(()),
        Caller::Job(j) if j == job => Ok(()),
        Caller::Job(j) => Err(Status::permission_denied(format!(
            "the secret of {j} cannot act on {job}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn tokens_make_callers_and_callers_act_on_their_own() {
        let (op, a, b) = (Token::generate(), Token::generate(), Token::generate());
        let keys = Keys::new(op.clone(), [(a.digest(), JobId(1))]);
        assert_eq!(keys.caller(Some(op.expose())).unwrap(), Caller::Operator);
        assert_eq!(
            keys.caller(Some(a.expose())).unwrap(),
            Caller::Job(JobId(1))
        );
        assert_eq!(
            keys.caller(Some(b.expose())).unwrap_err().code(),
            Code::Unauthenticated
        );
        assert_eq!(keys.caller(None).unwrap_err().code(), Code::Unauthenticated);
        keys.add(b.digest(), JobId(2));
        assert_eq!(
            keys.caller(Some(b.expose())).unwrap(),
            Caller::Job(JobId(2))
        );

        let req = |c: Caller| {
            let mut r = Request::new(());
            r.extensions_mut().insert(c);
            r
        };
        let (o, j1) = (req(Caller::Operator), req(Caller::Job(JobId(1))));
        assert!(operator(&o).is_ok());
        assert_eq!(operator(&j1).unwrap_err().code(), Code::PermissionDenied);
        assert!(job_itself(&j1, JobId(1)).is_ok());
        assert_eq!(
            job_itself(&j1, JobId(2)).unwrap_err().code(),
            Code::PermissionDenied
        );
        assert_eq!(
            job_itself(&o, JobId(1)).unwrap_err().code(),
            Code::PermissionDenied
        );
        assert!(operator_or_job(&o, JobId(2)).is_ok());
        assert!(operator_or_job(&j1, JobId(1)).is_ok());
        assert_eq!(
            operator_or_job(&j1, JobId(2)).unwrap_err().code(),
            Code::PermissionDenied
        );
        assert_eq!(
            operator(&Request::new(())).unwrap_err().code(),
            Code::Unauthenticated
        );

        // Insecure: no token, any token, every call.
        let open = Keys::insecure();
        assert_eq!(open.caller(None).unwrap(), Caller::Anyone);
        assert_eq!(open.caller(Some("x")).unwrap(), Caller::Anyone);
        let anyone = req(Caller::Anyone);
        assert!(operator(&anyone).is_ok());
        assert!(job_itself(&anyone, JobId(1)).is_ok());
        assert!(operator_or_job(&anyone, JobId(2)).is_ok());
    }

    #[test]
    fn the_metrics_token_reads_metrics_and_nothing_else() {
        let (op, scraper, job) = (Token::generate(), Token::generate(), Token::generate());
        let keys = Keys::new(op.clone(), [(job.digest(), JobId(1))]).scraped_with(scraper.clone());
        assert!(keys.may_scrape(Some(scraper.expose())));
        assert!(keys.may_scrape(Some(op.expose())));
        assert!(!keys.may_scrape(Some(job.expose())));
        assert!(!keys.may_scrape(Some("x")));
        assert!(!keys.may_scrape(None));
        // No gRPC call at all.
        assert_eq!(
            keys.caller(Some(scraper.expose())).unwrap_err().code(),
            Code::Unauthenticated
        );
        assert!(Keys::insecure().may_scrape(None));
    }
}
