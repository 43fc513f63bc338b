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
//!   PERMISSION_DENIED;
//! * a **job owner's token**, minted at submission and returned once (`brainctl submit` keeps it
//!   in `NAME.owner.token`): what the person who submitted the job does with it, for that job
//!   only (its record, events, logs and diagnosis; scale and cancel it; the console). It is a
//!   person's: no report, outcome, plan fetch or registration, which are the master's, takes it,
//!   and the master's secret does not sign in to the console;
//! * the **metrics token** (`metrics.token` beside the database): `GET /metrics` only (the
//!   operator token is taken there too), so a Prometheus server holds no power over jobs.
//!
//! The brain keeps only the secrets' SHA-256 (with whose each is), in its store. Handlers check
//! the caller with [`operator`], [`job_itself`], [`operator_or_owner`] and [`may_read`]. A brain
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
    /// A job's master (its job's secret).
    Job(JobId),
    /// The person who submitted a job (its owner's token).
    Owner(JobId),
    /// Anyone at all: the brain runs `--insecure`.
    Anyone,
}

/// Whose a job's token is: its master's or its owner's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    Master,
    Owner,
}

impl Holder {
    /// As the store keeps it.
    pub fn as_str(self) -> &'static str {
        match self {
            Holder::Master => "master",
            Holder::Owner => "owner",
        }
    }

    /// As the store keeps it; `None` for anything else.
    pub fn parse(text: &str) -> Option<Holder> {
        match text {
            "master" => Some(Holder::Master),
            "owner" => Some(Holder::Owner),
            _ => None,
        }
    }

    fn caller(self, job: JobId) -> Caller {
        match self {
            Holder::Master => Caller::Job(job),
            Holder::Owner => Caller::Owner(job),
        }
    }
}

/// The tokens the brain accepts.
pub struct Keys {
    /// `None`: insecure, no token is checked.
    operator: Option<Token>,
    jobs: RwLock<HashMap<[u8; 32], (JobId, Holder)>>,
    /// The scrapers' token for `GET /metrics`, which may do nothing else.
    scraper: Option<Token>,
}

impl Keys {
    pub fn new(operator: Token, jobs: impl IntoIterator<Item = ([u8; 32], JobId, Holder)>) -> Keys {
        Keys {
            operator: Some(operator),
            jobs: RwLock::new(jobs.into_iter().map(|(d, j, h)| (d, (j, h))).collect()),
            scraper: None,
        }
    }

    /// These keys with `token` taken for `GET /metrics` (besides the operator token).
    pub fn scraped_with(mut self, token: Token) -> Keys {
        self.scraper = Some(token);
        self
    }

    /// Whether tokens are checked at all (not `--insecure`).
    pub fn checked(&self) -> bool {
        self.operator.is_some()
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

    /// A job's token from now on (its digest is in the store already).
    pub fn add(&self, digest: [u8; 32], job: JobId, holder: Holder) {
        self.jobs
            .write()
            .expect("no panic under the lock")
            .insert(digest, (job, holder));
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
            .map(|&(job, holder)| holder.caller(job))
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
        Caller::Owner(j) => Err(Status::permission_denied(format!(
            "the owner's token of {j} cannot make operator calls: it reads, scales and \
             cancels its own job only"
        ))),
    }
}

/// Calls a job's master makes for its own job only: never a person's, the owner's included.
pub fn job_itself<T>(request: &Request<T>, job: JobId) -> Result<(), Status> {
    match caller(request)? {
        Caller::Job(j) if j == job => Ok(()),
        Caller::Anyone => Ok(()),
        Caller::Job(j) => Err(Status::permission_denied(format!(
            "the secret of {j} cannot act on {job}"
        ))),
        Caller::Operator | Caller::Owner(_) => Err(Status::permission_denied(format!(
            "only the job master of {job} makes this call, with its job's secret: a \
             person's token (the operator's or an owner's) never does"
        ))),
    }
}

/// The operator, or the owner of `job`: what a person does to a job (scale, cancel, diagnose).
pub fn operator_or_owner<T>(request: &Request<T>, job: JobId) -> Result<(), Status> {
    match caller(request)? {
        Caller::Operator | Caller::Anyone => Ok(()),
        Caller::Owner(j) if j == job => Ok(()),
        Caller::Owner(j) => Err(Status::permission_denied(format!(
            "the owner's token of {j} cannot act on {job}"
        ))),
        Caller::Job(j) => Err(Status::permission_denied(format!(
            "the secret of {j} is its job master's: a person's call takes the operator's or \
             the job owner's token"
        ))),
    }
}

/// Who may read `job` (its record, events, logs): the operator, its master, its owner.
pub fn may_read<T>(request: &Request<T>, job: JobId) -> Result<(), Status> {
    match caller(request)? {
        Caller::Operator | Caller::Anyone => Ok(()),
        Caller::Job(j) | Caller::Owner(j) if j == job => Ok(()),
        Caller::Job(j) => Err(Status::permission_denied(format!(
            "the secret of {j} cannot act on {job}"
        ))),
        Caller::Owner(j) => Err(Status::permission_denied(format!(
            "the owner's token of {j} cannot act on {job}"
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
        let keys = Keys::new(op.clone(), [(a.digest(), JobId(1), Holder::Master)]);
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
        keys.add(b.digest(), JobId(2), Holder::Master);
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
        assert!(may_read(&o, JobId(2)).is_ok());
        assert!(may_read(&j1, JobId(1)).is_ok());
        assert_eq!(
            may_read(&j1, JobId(2)).unwrap_err().code(),
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
        assert!(may_read(&anyone, JobId(2)).is_ok());
        assert!(operator_or_owner(&anyone, JobId(2)).is_ok());
    }

    /// An owner's token is a person's: it reads, scales and cancels its own job, and never
    /// makes a job master's call or an operator's.
    #[test]
    fn an_owner_s_token_acts_as_a_person_on_its_own_job_only() {
        let (op, master, owner) = (Token::generate(), Token::generate(), Token::generate());
        let keys = Keys::new(
            op,
            [
                (master.digest(), JobId(1), Holder::Master),
                (owner.digest(), JobId(1), Holder::Owner),
            ],
        );
        assert_eq!(
            keys.caller(Some(owner.expose())).unwrap(),
            Caller::Owner(JobId(1))
        );
        let req = |c: Caller| {
            let mut r = Request::new(());
            r.extensions_mut().insert(c);
            r
        };
        let (o1, m1) = (req(Caller::Owner(JobId(1))), req(Caller::Job(JobId(1))));
        let denied = |r: Result<(), Status>| r.unwrap_err().code() == Code::PermissionDenied;
        assert!(denied(job_itself(&o1, JobId(1))));
        assert!(denied(operator(&o1)));
        assert!(operator_or_owner(&o1, JobId(1)).is_ok());
        assert!(denied(operator_or_owner(&o1, JobId(2))));
        assert!(may_read(&o1, JobId(1)).is_ok());
        assert!(denied(may_read(&o1, JobId(2))));
        // The master's secret makes no person's call.
        assert!(denied(operator_or_owner(&m1, JobId(1))));
        assert!(operator_or_owner(&req(Caller::Operator), JobId(1)).is_ok());
    }

    #[test]
    fn the_metrics_token_reads_metrics_and_nothing_else() {
        let (op, scraper, job) = (Token::generate(), Token::generate(), Token::generate());
        let keys = Keys::new(op.clone(), [(job.digest(), JobId(1), Holder::Owner)])
            .scraped_with(scraper.clone());
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
