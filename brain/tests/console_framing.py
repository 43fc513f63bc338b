"""Another site's page cannot frame the brain's console: run by `tests/console.rs` against a
plain-text brain on 127.0.0.1 (so that the attacker's page, served here from another port of
127.0.0.1, is same-site and the browser sends the session cookie into the frame, as in the
attack this guards against).

Signs in as the operator, then opens the attacker's page, which frames the console's
overview. The frame must hold Chromium's error page (the console answers with
`X-Frame-Options: DENY` and `frame-ancestors 'none'`), not the signed-in console. Exits 0 when
it does, else says what the frame held and exits 1.
"""

import argparse
import http.server
import os
import sys
import threading
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True, help="the brain's http://127.0.0.1:PORT")
    p.add_argument("--token-file", required=True, help="the operator token's file")
    p.add_argument("--shots", required=True, help="where the screenshots go")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    a = p.parse_args()
    os.makedirs(a.shots, exist_ok=True)

    page = (f"<html><body><p>a page of another site</p>"
            f"<iframe id='framed' src='{a.url}/console' width='900' height='500'></iframe>"
            f"</body></html>").encode()

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    attacker = http.server.HTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()

    options = webdriver.ChromeOptions()
    options.binary_location = a.chromium
    for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1280,900"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(a.chromedriver), options=options)
    try:
        driver.get(a.url + "/console/login")
        try:
            with open(a.token_file) as f:
                token = f.read().strip()
        except FileNotFoundError:  # an --insecure brain takes any token
            token = "any"
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.ID, "sign-in").click()
        deadline = time.time() + 20
        while not driver.find_elements(By.ID, "who"):
            if time.time() > deadline:
                raise AssertionError(f"not signed in: {driver.page_source[:2000]}")
            time.sleep(0.1)

        driver.get(f"http://127.0.0.1:{attacker.server_port}/")
        driver.switch_to.frame(driver.find_element(By.ID, "framed"))
        framed_at = "about:blank"
        deadline = time.time() + 20
        while framed_at == "about:blank" and time.time() < deadline:
            time.sleep(0.2)
            framed_at = driver.execute_script("return document.URL")
        signed_in = driver.find_elements(By.ID, "who")
        driver.switch_to.default_content()
        driver.save_screenshot(os.path.join(a.shots, "framed.png"))
        if signed_in or not framed_at.startswith("chrome-error:"):
            raise AssertionError(
                f"the signed-in console was framed by another site's page: the frame is at "
                f"{framed_at} and shows {'the signed-in console' if signed_in else 'a page'}")
    except AssertionError as e:
        print(f"console_framing: {e}", file=sys.stderr)
        return 1
    finally:
        driver.quit()
        attacker.shutdown()
    print(f"console_framing: the frame held Chromium's error page ({framed_at})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
