//! The web console of a real brain (its own TLS): its doors over HTTPS (no session, a wrong
//! token, a forged or cross-site POST, another job's secret, an unknown job), and the whole
//! walk in a real browser (Debian's Chromium driven by Selenium through
//! `tests/console_browser.py`: sign in, a job appears and is resized and cancelled from the
//! page; screenshots kept).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{brainctl, http_client, jobs, token_file};
use reqwest::StatusCode;

/// A job that runs for minutes unless cancelled (a step of 128 samples sleeps about 0.5 s).
fn slow_spec(dir: &Path, name: &str) -> PathBuf {
    let text = format!(
        "name: {name}\nkind: allreduce\nroles:\n  worker:\n    min: 1\n    max: 3\n\
         workload:\n  builtin:\n    batch_size: 128\n    step_delay_us: 4000\n\
         data:\n  num_samples: 200000\n  shard_size: 1000\n  eval_samples: 1000\n\
         checkpoint:\n  dir: checkpoints\n  every_shards: 5\n"
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// A brain of 4 CPUs that resizes no job by itself (a long cool-down), with `names` submitted
/// and running; its URL.
async fn brain_with_running(d: &Path, names: &[&str]) -> (common::Brain, String) {
    let (brain, url) = common::still_brain(d, 4);
    for name in names {
        let (ok, out) = brainctl(&[
            "submit",
            slow_spec(d, name).to_str().unwrap(),
            "--brain",
            &url,
        ]);
        assert!(ok, "{out}");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let all = jobs(&url).await.unwrap_or_default();
        if all.len() == names.len() && all.iter().all(|j| j.state == "running") {
            break;
        }
        assert!(Instant::now() < deadline, "not all running: {all:#?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (brain, url)
}

/// A browser-like client of the console: no redirect followed, its session cookie kept by
/// hand.
struct Visitor {
    client: reqwest::Client,
    base: String,
    cookie: Option<String>,
}

impl Visitor {
    fn new(url: &str) -> Visitor {
        let (client, base) = http_client(url);
        let client = client
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        Visitor {
            client,
            base,
            cookie: None,
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, String, String) {
        let mut r = self.client.get(format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            r = r.header("cookie", c);
        }
        answer(r.send().await.unwrap()).await
    }

    async fn post(
        &self,
        path: &str,
        form: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> (StatusCode, String, String) {
        let mut r = self.client.post(format!("{}{path}", self.base)).form(form);
        // What a browser sends with a form it posts (a POST without it is refused), unless
        // the test sends another.
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("origin"))
        {
            r = r.header("origin", &self.base);
        }
        if let Some(c) = &self.cookie {
            r = r.header("cookie", c);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        answer(r.send().await.unwrap()).await
    }

    /// Signs in with `token`: where it was sent, and the session cookie kept.
    async fn sign_in(&mut self, token: &str) -> String {
        let r = self
            .client
            .post(format!("{}/console/login", self.base))
            .header("origin", &self.base)
            .form(&[("token", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
        let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
        for attr in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/console"] {
            assert!(set.contains(attr), "{set}");
        }
        self.cookie = Some(set.split(';').next().unwrap().to_string());
        r.headers()["location"].to_str().unwrap().to_string()
    }
}

/// The status, the `Location` header (empty: none) and the body.
async fn answer(r: reqwest::Response) -> (StatusCode, String, String) {
    let status = r.status();
    let location = r
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, location, r.text().await.unwrap())
}

/// The CSRF token a page's forms carry.
fn csrf(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF token in {page}"));
    page[at + 19..].split('"').next().unwrap().to_string()
}

async fn state_of(url: &str, name: &str) -> String {
    jobs(url)
        .await
        .unwrap()
        .into_iter()
        .find(|j| j.job_name == name)
        .unwrap()
        .state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consoles_doors_let_in_only_whom_they_should() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut brain, url) = brain_with_running(d, &["door-a", "door-b"]).await;
    let all = jobs(&url).await.unwrap();
    let a = all.iter().find(|j| j.job_name == "door-a").unwrap().clone();
    let b = all.iter().find(|j| j.job_name == "door-b").unwrap().clone();
    let (job_a, job_b) = (
        format!("/console/jobs/{}", a.job_id),
        format!("/console/jobs/{}", b.job_id),
    );

    // Without a session: sent to sign in, for pages and for forms alike; nothing changes.
    let mut v = Visitor::new(&url);
    for path in ["/console", "/console/policy", job_a.as_str()] {
        let (status, to, _) = v.get(path).await;
        assert_eq!(
            (status, to.as_str()),
            (StatusCode::SEE_OTHER, "/console/login"),
            "{path}"
        );
    }
    let (status, to, _) = v
        .post(&format!("{job_a}/cancel"), &[("csrf", "x")], &[])
        .await;
    assert_eq!(
        (status, to.as_str()),
        (StatusCode::SEE_OTHER, "/console/login")
    );
    let (status, _, page) = v.get("/console/login").await;
    assert!(
        status.is_success() && page.contains("name=\"token\""),
        "{page}"
    );

    // A wrong token: refused, no cookie, counted.
    let (status, _, page) = v
        .post("/console/login", &[("token", "not-a-token")], &[])
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(page.contains("not one this brain gave"), "{page}");
    // Every page says it may not be framed, and what it may load.
    let r = v
        .client
        .get(format!("{}/console/login", v.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
        "{csp}"
    );

    // The operator: every job, the policy page, each job's page with its forms.
    let operator = std::fs::read_to_string(token_file(&url)).unwrap();
    assert_eq!(v.sign_in(operator.trim()).await, "/console");
    let (status, _, page) = v.get("/console").await;
    assert!(status.is_success(), "{page}");
    assert!(page.contains("door-a") && page.contains("door-b"), "{page}");
    assert!(page.contains("id=\"nodes\""), "{page}");
    let (status, _, page) = v.get("/console/policy").await;
    assert!(
        status.is_success() && page.contains("cooldown_s = 3600"),
        "{page}"
    );
    assert!(
        page.contains("id=\"decisions\"")
            && page.contains("<th>roles</th>")
            && page.contains("door-a"),
        "{page}"
    );
    let (status, _, page) = v.get(&job_a).await;
    assert!(
        status.is_success() && page.contains("id=\"scale\""),
        "{page}"
    );
    let token = csrf(&page);

    // Forged POSTs: no CSRF token, a wrong one, or the right one from another site (as the
    // browser marks it, or as its Origin says).
    for (form, headers) in [
        (vec![], vec![]),
        (vec![("csrf", "forged")], vec![]),
        (
            vec![("csrf", token.as_str())],
            vec![("sec-fetch-site", "cross-site")],
        ),
        (
            vec![("csrf", token.as_str())],
            vec![("origin", "https://evil.example")],
        ),
        (vec![("csrf", token.as_str())], vec![("origin", "null")]),
    ] {
        let (status, _, page) = v.post(&format!("{job_a}/cancel"), &form, &headers).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{form:?} {headers:?}: {page}"
        );
        assert!(page.contains("nothing changed"), "{page}");
    }
    assert_eq!(state_of(&url, "door-a").await, "running");

    // Bad input in a form: said, nothing changed.
    let (status, _, page) = v
        .post(
            &format!("{job_a}/scale"),
            &[("csrf", &token), ("workers", "many")],
            &[],
        )
        .await;
    assert!(status.is_success(), "{page}");
    assert!(
        page.contains("workers: &quot;many&quot; is not a count"),
        "{page}"
    );
    let (_, _, page) = v.get("/console/jobs/999").await;
    assert!(page.contains("999"), "{page}");
    assert_eq!(v.get("/console/jobs/999").await.0, StatusCode::NOT_FOUND);

    // A job master's secret (what its master presents) signs in nowhere: it is a process's.
    let secret =
        std::fs::read_to_string(brain::launch::credential_file(Path::new(&a.run_dir))).unwrap();
    let (status, _, page) = Visitor::new(&url)
        .post("/console/login", &[("token", secret.trim())], &[])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(
        page.contains("job master&#39;s secret") || page.contains("job master's secret"),
        "{page}"
    );

    // The owner's token brainctl submit kept: that job only, with its scale and cancel forms.
    let owner_token = std::fs::read_to_string(common::owner_token_file(&url, a.job_id)).unwrap();
    let mut owner = Visitor::new(&url);
    assert_eq!(owner.sign_in(owner_token.trim()).await, job_a);
    let (status, to, _) = owner.get("/console").await;
    assert_eq!(
        (status, to.as_str()),
        (StatusCode::SEE_OTHER, job_a.as_str())
    );
    let (status, _, page) = owner.get(&job_a).await;
    assert!(status.is_success() && page.contains("door-a"), "{page}");
    assert!(
        page.contains("id=\"scale\"") && page.contains("id=\"cancel\""),
        "{page}"
    );
    assert!(
        page.contains("id=\"events\"") && page.contains("owner"),
        "{page}"
    );
    let (status, _, page) = owner.get(&job_b).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{page}");
    assert!(
        !page.contains("door-b"),
        "another job's page leaked: {page}"
    );
    assert_eq!(owner.get("/console/policy").await.0, StatusCode::FORBIDDEN);
    // Another job's form: refused, nothing changed.
    let own = csrf(&owner.get(&job_a).await.2);
    let (_, _, page) = owner
        .post(&format!("{job_b}/cancel"), &[("csrf", &own)], &[])
        .await;
    assert!(page.contains("cannot act on"), "{page}");
    assert_eq!(state_of(&url, "door-b").await, "running");

    // The operator cancels from the page; signed out, the session is gone.
    let (status, _, page) = v
        .post(&format!("{job_b}/cancel"), &[("csrf", &token)], &[])
        .await;
    assert!(
        status.is_success() && page.contains("The job is cancelling"),
        "{page}"
    );
    let (status, to, _) = v.post("/console/logout", &[("csrf", &token)], &[]).await;
    assert_eq!(
        (status, to.as_str()),
        (StatusCode::SEE_OTHER, "/console/login")
    );
    assert_eq!(v.get("/console").await.0, StatusCode::SEE_OTHER);
    let deadline = Instant::now() + Duration::from_secs(60);
    while state_of(&url, "door-b").await != "cancelled" {
        assert!(Instant::now() < deadline, "door-b was not cancelled");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The owner cancels their own job from its page.
    let (status, _, page) = owner
        .post(&format!("{job_a}/cancel"), &[("csrf", &own)], &[])
        .await;
    assert!(
        status.is_success() && page.contains("The job is cancelling"),
        "{page}"
    );
    brain.kill();
}

/// A flood of wrong tokens at the sign-in: each address gets `limits.sign_ins_per_minute`
/// (10) tries a minute, right or wrong, the rest answered 429 with the time to wait; each
/// failure is logged with its address and counted in `/metrics`, and so is each refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_ins_are_limited_per_address_and_each_failure_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut brain, url) = common::still_brain(d, 4);
    let v = Visitor::new(&url);
    let mut answers = std::collections::BTreeMap::new();
    for i in 0..30 {
        let (status, _, page) = v
            .post("/console/login", &[("token", &format!("guess-{i}"))], &[])
            .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(page.contains("sign_ins_per_minute"), "{page}");
        }
        *answers.entry(status.as_u16()).or_insert(0) += 1;
    }
    assert_eq!(answers, [(401, 10), (429, 20)].into(), "{answers:?}");
    // The operator's own token from the same address waits too.
    let operator = std::fs::read_to_string(token_file(&url)).unwrap();
    let (status, _, _) = v
        .post("/console/login", &[("token", operator.trim())], &[])
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let metrics = common::scrape(&url);
    for line in [
        "brain_console_sign_in_failures_total 10",
        "brain_throttled_total{limit=\"sign_ins_per_minute\"} 21",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in:\n{metrics}"
        );
    }
    let log: String = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("brain-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let logged = log
        .lines()
        .filter(|l| l.contains("console sign-in with a token this brain did not give"))
        .count();
    assert_eq!(logged, 10, "{log}");
    assert!(log.contains("127.0.0.1"), "the address is logged: {log}");
    brain.kill();
}

/// Chromium, its driver and Selenium for `python3`, or why not.
fn browser() -> Result<(), String> {
    for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        if !Path::new(bin).exists() {
            return Err(format!("{bin} is missing"));
        }
    }
    let selenium = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import selenium"])
        .output();
    match selenium {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err("/usr/bin/python3 cannot import selenium".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_browser_signs_in_and_scales_and_cancels_a_job_it_watched_appear() {
    if let Err(why) = browser() {
        test_support::optional_server(
            "BRAIN_REQUIRE_BROWSER",
            &format!("a browser to drive ({why})"),
            "apt-get install chromium chromium-driver python3-selenium",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut brain, url) = common::still_brain(d, 4);
    let addr = url.trim_start_matches("http://").to_string();
    let spec = slow_spec(d, "watched");
    let ca = common::own_ca(&url).expect("the brain's own TLS");
    let submit = serde_json::json!([
        env!("CARGO_BIN_EXE_brainctl"),
        "submit",
        spec,
        "--brain",
        url,
        "--token-file",
        token_file(&url),
        "--ca",
        ca,
    ]);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console_browser.py");
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(script)
        .args(["--url", &format!("https://{addr}"), "--job", "watched"])
        .arg("--token-file")
        .arg(token_file(&url))
        .arg("--submit")
        .arg(submit.to_string())
        .arg("--shots")
        .arg(&shots)
        .output()
        .await
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{said}\nscreenshots in {}",
        shots.display()
    );
    let taken = std::fs::read_dir(&shots).unwrap().count();
    assert!(taken >= 9, "{taken} screenshots in {}", shots.display());
    eprintln!("console screenshots: {}", shots.display());
    // What the page did is what the brain did: the plan it made, the job cancelled.
    let all = jobs(&url).await.unwrap();
    let job = all.iter().find(|j| j.job_name == "watched").unwrap();
    assert_eq!(job.state, "cancelled", "{job:#?}");
    assert_eq!(job.reached_version, 1, "{job:#?}");
    brain.kill();
}

/// Another site's page cannot frame the signed-in console (a click there could cancel a job):
/// Chromium, signed in, opens a page of another port of 127.0.0.1 (same-site: the session
/// cookie goes into the frame) that frames the console, and the frame holds its error page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_sites_page_cannot_frame_the_signed_in_console() {
    if let Err(why) = browser() {
        test_support::optional_server(
            "BRAIN_REQUIRE_BROWSER",
            &format!("a browser to drive ({why})"),
            "apt-get install chromium chromium-driver python3-selenium",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("policy.toml"),
        "heuristics = []\n[live]\ninterval_s = 1\n",
    )
    .unwrap();
    let (mut brain, addr) = common::start_brain_with(d, "127.0.0.1:0", 4, |cmd| {
        cmd.arg("--insecure");
    });
    let url = format!("http://{addr}");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-framing");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console_framing.py");
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(script)
        .args(["--url", &url])
        .arg("--token-file")
        .arg(token_file(&url))
        .arg("--shots")
        .arg(&shots)
        .output()
        .await
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{said}\nscreenshot in {}",
        shots.display()
    );
    brain.kill();
}

/// The what-if page replays a trace the config names under the policy in force and a policy
/// file, with the figures `brainctl whatif` prints for the same replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whatif_page_replays_a_configured_trace_as_brainctl_whatif_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let trace = root.join("datasets/data/pollux/workloads/workload-1.csv");
    let pollux = root.join("examples/policies/pollux.toml");
    let (mut brain, url) = common::configured_brain(
        d,
        &format!(
            "[console.whatif]\ntraces = [\"{}\"]\npolicies = [\"{}\"]\ncluster = \"8x4:t4\"\n",
            trace.display(),
            pollux.display()
        ),
        |_| {},
    );
    let mut v = Visitor::new(&url);
    let operator = std::fs::read_to_string(token_file(&url)).unwrap();
    v.sign_in(operator.trim()).await;
    let (status, _, page) = v.get("/console/whatif").await;
    assert!(
        status.is_success() && page.contains("workload-1.csv"),
        "{page}"
    );
    let token = csrf(&page);
    let (status, _, page) = v
        .post(
            "/console/whatif",
            &[("csrf", &token), ("trace", "0"), ("policy", "0")],
            &[],
        )
        .await;
    assert!(status.is_success(), "{page}");
    assert!(page.contains("id=\"whatif-table\""), "{page}");
    assert!(
        page.contains("where the distance to the bound goes"),
        "{page}"
    );
    assert!(
        page.contains("in force (elastic_lp)") && page.contains("<svg"),
        "{page}"
    );
    // The pollux row is the one brainctl whatif prints for the same replay.
    let (ok, out) = brainctl(&[
        "whatif",
        "--trace",
        trace.to_str().unwrap(),
        "--policy",
        pollux.to_str().unwrap(),
        "--cluster",
        "8x4:t4",
    ]);
    assert!(ok, "{out}");
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("pollux"))
        .unwrap_or_else(|| panic!("no pollux row in {out}"));
    // The same figures (the columns are as wide as the longest label).
    let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let on_page = page
        .lines()
        .find(|l| l.trim_start().starts_with("pollux "))
        .unwrap_or_else(|| panic!("no pollux row on {page}"));
    assert_eq!(words(on_page), words(row));
    // Without its CSRF token: refused; a trace it does not name: said.
    let (status, _, _) = v.post("/console/whatif", &[("trace", "0")], &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, _, page) = v
        .post("/console/whatif", &[("csrf", &token), ("trace", "7")], &[])
        .await;
    assert!(page.contains("no trace number 7"), "{page}");
    brain.kill();
}
