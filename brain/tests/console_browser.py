"""The brain's web console in a real browser (Debian's Chromium through chromedriver, driven
by Selenium): run by `tests/console.rs`, which starts the brain and says how to submit a job.

Signs in (a wrong token first), watches the submitted job appear, opens it, scales it from the
page and waits until its master has carried the plan out, checks that a forged POST is refused,
cancels it from the page and signs out; a screenshot after each step in --shots. Exits 0 when
every step held, else prints which did not and exits 1.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True, help="the brain's https://HOST:PORT")
    p.add_argument("--token-file", required=True, help="the operator token's file")
    p.add_argument("--submit", required=True, help="the brainctl command that submits the job (JSON list)")
    p.add_argument("--job", required=True, help="the submitted job's name")
    p.add_argument("--shots", required=True, help="where the screenshots go")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    a = p.parse_args()
    os.makedirs(a.shots, exist_ok=True)

    options = webdriver.ChromeOptions()
    options.binary_location = a.chromium
    for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 # The brain's own CA is not in this browser's store: its certificate is
                 # checked by the Rust side of the test instead.
                 "--ignore-certificate-errors", "--window-size=1280,1400"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(a.chromedriver), options=options)
    shot_number = [0]

    def shot(name):
        shot_number[0] += 1
        driver.save_screenshot(os.path.join(a.shots, f"{shot_number[0]:02d}-{name}.png"))

    def text(css):
        return driver.find_element(By.CSS_SELECTOR, css).text

    def at(suffix, timeout=20):
        """Waits for the browser to be at a URL ending in `suffix` (a click returns before the
        navigation it starts has committed)."""
        deadline = time.time() + timeout
        while not driver.current_url.split("?")[0].endswith(suffix):
            if time.time() > deadline:
                raise AssertionError(f"not at ...{suffix} but at {driver.current_url}")
            time.sleep(0.1)

    def wait_for(what, check, url=None, timeout=120):
        deadline = time.time() + timeout
        while True:
            if url:
                driver.get(url)
            try:
                if check():
                    return
            except Exception:  # the page is between two loads
                pass
            if time.time() > deadline:
                shot("timed-out")
                raise AssertionError(f"timed out waiting for {what}; the page:\n{driver.page_source[:4000]}")
            time.sleep(1)

    try:
        # Nothing without signing in.
        driver.get(a.url + "/console")
        at("/console/login")
        shot("sign-in")
        driver.find_element(By.ID, "token").send_keys("not-a-token")
        driver.find_element(By.ID, "sign-in").click()
        wait_for("the refusal", lambda: "not one this brain gave" in text("#error"), timeout=20)
        shot("wrong-token")
        with open(a.token_file) as f:
            driver.find_element(By.ID, "token").send_keys(f.read().strip())
        driver.find_element(By.ID, "sign-in").click()
        at("/console")
        assert "operator" in text("#who")
        shot("signed-in")

        # The job appears (the page reloads itself) and runs.
        out = subprocess.run(json.loads(a.submit), capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for("the job to run", lambda: any(
            a.job in row.text and "running" in row.text
            for row in driver.find_elements(By.CSS_SELECTOR, "#jobs tr")))
        shot("job-running")
        driver.find_element(By.LINK_TEXT, a.job).click()
        wait_for("the job's page", lambda: "/console/jobs/" in driver.current_url, timeout=20)
        job_url = driver.current_url.split("?")[0]
        assert text("#state") == "running"
        shot("job-page")

        # Scaled from the page to another size than the brain gave it; the plan carried out
        # by its master.
        started = int(text("#sizes").split()[1])
        workers = 1 if started > 1 else 2
        driver.find_element(By.ID, "workers").send_keys(str(workers))
        driver.find_element(By.ID, "scale-submit").click()
        wait_for("the plan proposed", lambda: "Plan 1 proposed" in text("#notice"), timeout=20)
        shot("scale-proposed")
        wait_for("the plan to be reached", lambda: text("#reached") == "1 of 1"
                 and text("#sizes").startswith(f"worker {workers} "), url=job_url)
        wait_for("the timeline chart", lambda: driver.find_elements(By.CSS_SELECTOR, "#timeline svg"),
                 url=job_url)
        assert "by hand (the console)" in text("#plans")
        assert "plan 1 reached" in text("#events") and f"-> worker {workers}" in text("#events"), \
            text("#events")
        shot("resized")

        # A POST without the page's CSRF token, from this very page: refused.
        status = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', body: new URLSearchParams({csrf: 'forged'})})"
            ".then(r => done(r.status), e => done(String(e)));",
            job_url + "/cancel")
        assert status == 403, status
        driver.get(job_url)
        assert text("#state") == "running", text("#state")

        # Cancelled from the page.
        driver.find_element(By.ID, "cancel-submit").click()
        wait_for("the job cancelling", lambda: "cancelling" in text("#notice"), timeout=20)
        wait_for("the job to be cancelled", lambda: text("#state") == "cancelled", url=job_url)
        shot("cancelled")

        driver.find_element(By.ID, "sign-out").click()
        at("/console/login")
        driver.get(a.url + "/console")
        at("/console/login")
        shot("signed-out")
    except AssertionError as e:
        shot("failed")
        print(f"console_browser: {e}\nthe page at {driver.current_url}:\n{driver.page_source[:3000]}",
              file=sys.stderr)
        return 1
    finally:
        driver.quit()
    print(f"console_browser: every step held; screenshots in {a.shots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
