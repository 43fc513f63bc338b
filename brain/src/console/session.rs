//! Who is signed in to the console: a session per sign-in, named by a random cookie
//! (HttpOnly, SameSite=Strict, `Secure` under TLS, path `/console`), holding the caller its
//! token made (the operator, or one job) and the CSRF token every form of the session carries.
//! The brain keeps only the cookies' SHA-256; sessions end at sign-out, after
//! [`SESSION_TTL`], or when the brain restarts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use cookie::{Cookie, SameSite};

use crate::auth::Caller;

/// The cookie that names a session.
pub const COOKIE: &str = "brain_session";
/// How long a session lasts after its sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The most sessions held at once; the oldest goes first.
const MAX_SESSIONS: usize = 10_000;

/// A signed-in session.
#[derive(Clone, Debug)]
pub struct Session {
    pub caller: Caller,
    /// What every form of this session carries back (`csrf`), checked on each POST.
    pub csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether `presented` is this session's CSRF token.
    pub fn csrf_matches(&self, presented: &str) -> bool {
        auth::digests_match(&auth::digest_of(&self.csrf), &auth::digest_of(presented))
    }

    /// Who this is, in words.
    pub fn who(&self) -> String {
        match self.caller {
            Caller::Operator => "the operator".into(),
            Caller::Owner(j) => format!("{j}'s owner"),
            Caller::Job(j) => format!("{j}'s master"),
            Caller::Anyone => "anyone (the brain runs --insecure)".into(),
        }
    }
}

#[derive(Default)]
pub struct Sessions {
    by_digest: Mutex<HashMap<[u8; 32], Session>>,
}

impl Sessions {
    /// A new session for `caller`: the `Set-Cookie` value that names it, and the session.
    pub fn sign_in(&self, caller: Caller, secure: bool) -> (String, Session) {
        let id = auth::Token::generate();
        let session = Session {
            caller,
            csrf: auth::Token::generate().expose().to_string(),
            expires: Instant::now() + SESSION_TTL,
        };
        let mut all = self.by_digest.lock().expect("no panic under the lock");
        let now = Instant::now();
        all.retain(|_, s| s.expires > now);
        if all.len() >= MAX_SESSIONS
            && let Some(oldest) = all.iter().min_by_key(|(_, s)| s.expires).map(|(k, _)| *k)
        {
            all.remove(&oldest);
        }
        all.insert(id.digest(), session.clone());
        let cookie = Cookie::build((COOKIE, id.expose().to_string()))
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(secure)
            .path("/console")
            .max_age(cookie::time::Duration::seconds(SESSION_TTL.as_secs() as i64))
            .build();
        (cookie.to_string(), session)
    }

    /// The live session the request's cookie names, if any.
    pub fn get(&self, headers: &HeaderMap) -> Option<Session> {
        let id = session_cookie(headers)?;
        let all = self.by_digest.lock().expect("no panic under the lock");
        all.get(&auth::digest_of(&id))
            .filter(|s| s.expires > Instant::now())
            .cloned()
    }

    /// Ends the request's session; the `Set-Cookie` value that clears the cookie.
    pub fn sign_out(&self, headers: &HeaderMap, secure: bool) -> String {
        if let Some(id) = session_cookie(headers) {
            self.by_digest
                .lock()
                .expect("no panic under the lock")
                .remove(&auth::digest_of(&id));
        }
        let mut cookie = Cookie::build((COOKIE, ""))
            .http_only(true)
            .same_site(SameSite::Strict)
            .secure(secure)
            .path("/console")
            .build();
        cookie.make_removal();
        cookie.to_string()
    }
}

/// The session cookie's value in the request's `Cookie` headers.
fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_string())
}

/// Whether the browser says the request comes from another site (`Sec-Fetch-Site`): such a
/// POST is refused whatever it carries.
/// Whether a POST's `Origin` is the console's own (the host it was sent to): browsers send it
/// with every form they post, so one missing or naming another site is refused.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(origin), Some(host)) = (text(header::ORIGIN), text(header::HOST)) else {
        return false;
    };
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    authority.is_some_and(|a| a.eq_ignore_ascii_case(host))
}

pub fn cross_site(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == "cross-site")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_cookie(set_cookie: &str) -> HeaderMap {
        let pair = set_cookie.split(';').next().unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_str(pair).unwrap());
        h
    }

    #[test]
    fn a_session_is_named_by_its_cookie_and_ends_at_sign_out() {
        let sessions = Sessions::default();
        let (set, s) = sessions.sign_in(Caller::Owner(vocab::JobId(7)), true);
        for attr in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/console"] {
            assert!(set.contains(attr), "{set}");
        }
        let h = with_cookie(&set);
        let got = sessions.get(&h).unwrap();
        assert_eq!(got.caller, Caller::Owner(vocab::JobId(7)));
        assert!(got.csrf_matches(&s.csrf) && !got.csrf_matches("forged"));
        // Another cookie value, or none: no session.
        assert!(sessions.get(&with_cookie("brain_session=abc")).is_none());
        assert!(sessions.get(&HeaderMap::new()).is_none());
        let cleared = sessions.sign_out(&h, false);
        assert!(cleared.contains("Max-Age=0"), "{cleared}");
        assert!(sessions.get(&h).is_none());
        // Without TLS the cookie cannot say Secure (the browser would drop it).
        let (set, _) = sessions.sign_in(Caller::Operator, false);
        assert!(!set.contains("Secure"), "{set}");
    }
}
