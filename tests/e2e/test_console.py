"""The console in headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium) against a real bin/api and bin/worker: an operator signs in, filters, opens an
execution, resolves an unknown step, completes a wait while the page updates itself, and
bulk-retries with a preview; a read-only key sees no action and its forged POST is
refused; a POST without the CSRF token is refused. Each page is saved as a screenshot
under the test's tmp_path. One browser serves the whole module."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from flowforge.store import apikeys
from tests.support.api import Api, step
from tests.support.definitions import unsigned
from tests.support.processes import Process
from tests.support.target import Reply, Target

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
)
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """Headless Chromium with a fresh profile; the driver path is given, so Selenium's
    driver manager never runs (SE_OFFLINE keeps it off the network regardless)."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail(
            "chromium and chromium-driver are needed: apt-get install chromium chromium-driver"
        )
    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@contextlib.contextmanager
def dropping_server() -> Iterator[str]:
    """A loopback HTTP server that reads each request whole and closes the connection
    without a word: the request was sent, its effect is unknown."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                while length and len(body) < int(length.group(1)):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        thread.join(5)


def shot(driver: WebDriver, tmp_path: Path, name: str) -> None:
    driver.save_screenshot(str(tmp_path / f"{name}.png"))


def until(driver: WebDriver, condition: Callable[[WebDriver], Any], timeout: float = 20) -> Any:
    """Wait for `condition`; a live page swaps its fragment when its execution changes, so
    an element found a moment ago may be gone when read: that is a retry, not a failure."""
    return WebDriverWait(
        driver,
        timeout,
        poll_frequency=0.1,
        ignored_exceptions=(StaleElementReferenceException,),
    ).until(condition)


def sign_in(driver: WebDriver, base: str, key: str, tmp_path: Path | None = None) -> None:
    driver.get(f"{base}/ui/signin")
    driver.delete_all_cookies()
    driver.get(f"{base}/ui/signin")
    driver.find_element(By.ID, "api_key").send_keys(key)
    if tmp_path is not None:
        shot(driver, tmp_path, "signin")
    driver.find_element(By.ID, "signin").click()
    until(driver, lambda d: "/ui/executions" in d.current_url)


def listed(driver: WebDriver) -> list[str]:
    return [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#executions a.mono") if a.text]


def events(client: Api, eid: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in client.execution(eid)["events"] if e["kind"] == kind]


def test_an_operator_filters_resolves_completes_and_bulk_retries_in_the_browser(
    browser: WebDriver,
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    target: Target,
    tmp_path: Path,
) -> None:
    client = Api(api, api_key)
    with dropping_server() as dropper:
        client.publish(
            "pay",
            unsigned(
                [
                    {
                        "id": "charge",
                        "type": "http_request",
                        "request": {"method": "POST", "url": f"{dropper}/charge", "json": {}},
                    },
                    {
                        "id": "receipt",
                        "type": "transform",
                        "depends_on": ["charge"],
                        "output": {"charge": "{{ charge }}"},
                    },
                ]
            ),
        )
        client.publish(
            "approve",
            unsigned(
                [
                    {"id": "approval", "type": "wait", "timeout_s": 3600},
                    {
                        "id": "ship",
                        "type": "transform",
                        "depends_on": ["approval"],
                        "output": {"ok": "{{ approval.approved }}"},
                    },
                ]
            ),
        )
        fetch = {"method": "GET", "url": f"{target.url}/flaky"}
        flaky = unsigned([{"id": "fetch", "type": "http_request", "request": fetch}])
        client.publish("flaky", flaky)
        target.script = lambda r: Reply(status=400, json={"error": "not yet"})
        workers()
        paid = client.start("pay", {"order": 1})
        waiting = client.start("approve", {"order": 2})
        watched = client.start("approve", {"order": 3})
        failed = [client.start("flaky", {"batch": "b1", "n": n}) for n in range(3)]
        client.wait(paid, "needs_attention")
        client.wait(waiting, "waiting")
        client.wait(watched, "waiting")
        for eid in failed:
            client.wait(eid, "failed")

    # Sign in, then filter by workflow and status, and by an input path.
    sign_in(browser, api, api_key, tmp_path)
    assert set(listed(browser)) == {paid, waiting, watched, *failed}
    Select(browser.find_element(By.ID, "f-workflow")).select_by_value("flaky")
    Select(browser.find_element(By.ID, "f-status")).select_by_value("failed")
    browser.find_element(By.ID, "apply").click()
    until(browser, lambda d: "workflow=flaky" in d.current_url)
    assert sorted(listed(browser)) == sorted(failed)
    assert "failed 3" in browser.find_element(By.ID, "counts").text
    shot(browser, tmp_path, "executions")
    browser.get(f"{api}/ui/executions?path=n&value=1")
    assert listed(browser) == [failed[1]]

    # The execution whose charge nobody knows about: the DAG says so.
    browser.get(f"{api}/ui/executions")
    browser.find_element(By.LINK_TEXT, paid).click()
    node = until(browser, lambda d: d.find_element(By.CSS_SELECTOR, 'g.node[data-step="charge"]'))
    assert node.get_attribute("data-status") == "unknown"
    assert "unknown" in browser.find_element(By.ID, "timeline").get_attribute("innerHTML")
    shot(browser, tmp_path, "execution-unknown")

    # The attention inbox: what was sent, and resolve as succeeded with an output.
    browser.get(f"{api}/ui/attention")
    section = browser.find_element(By.ID, f"unknown-{paid}-charge")
    assert "/charge" in section.text and "sent at" in section.text
    shot(browser, tmp_path, "attention")
    section.find_element(By.NAME, "output").send_keys('{"id": "ch_1"}')
    section.find_element(By.CSS_SELECTOR, "button.resolve-button").click()
    until(browser, lambda d: d.find_elements(By.ID, "nothing-unknown"))
    done = client.wait(paid, "succeeded")
    assert step(done, "charge")["output"] == {"id": "ch_1"}
    assert step(done, "receipt")["output"] == {"charge": {"id": "ch_1"}}
    (resolved,) = events(client, paid, "step.resolved")
    assert (resolved["detail"]["actor"]["kind"], resolved["detail"]["actor"]["name"]) == (
        "api_key",
        "tests",
    )

    # A page left open follows its execution: resumed through the API, the page shows it
    # finish without a reload (the marker set on this document is still there).
    browser.get(f"{api}/ui/executions/{watched}")
    assert browser.find_element(By.ID, "execution-status").text == "waiting"
    browser.execute_script("window.stillThisPage = true;")
    done = client.post(
        f"/api/v1/executions/{watched}/steps/approval/complete", {"output": {"approved": True}}
    )
    assert done.status_code == 200, done.text
    until(browser, lambda d: d.find_element(By.ID, "execution-status").text == "succeeded")
    assert browser.execute_script("return window.stillThisPage === true;")
    assert browser.find_element(By.ID, "live").get_attribute("data-live") == "0"

    # Complete the wait on its execution page, which then follows the run by itself.
    browser.get(f"{api}/ui/executions/{waiting}")
    assert browser.find_element(By.ID, "live").get_attribute("data-live") == "1"
    browser.find_element(By.CSS_SELECTOR, "form.complete textarea").send_keys('{"approved": true}')
    browser.find_element(By.ID, "complete-approval").click()
    until(browser, lambda d: d.find_element(By.ID, "execution-status").text == "succeeded")
    shot(browser, tmp_path, "execution")
    (completed,) = events(client, waiting, "wait.completed")
    assert completed["detail"]["actor"]["name"] == "tests"
    assert step(client.execution(waiting), "ship")["output"] == {"ok": True}

    # Bulk retry by the current filter: the preview's count, the confirmation, the result.
    target.script = lambda r: Reply(json={"ok": True})
    browser.get(f"{api}/ui/executions?workflow=flaky&status=failed")
    browser.find_element(By.ID, "bulk-retry").click()
    assert until(browser, lambda d: d.find_element(By.ID, "preview-count")).text == "3"
    shot(browser, tmp_path, "bulk-preview")
    browser.find_element(By.ID, "confirm").click()
    until(browser, lambda d: d.find_elements(By.ID, "finished"))
    assert browser.find_element(By.ID, "done").text == "3"
    shot(browser, tmp_path, "bulk-done")
    for eid in failed:
        assert client.wait(eid, "succeeded")["status"] == "succeeded"
        (retried,) = events(client, eid, "execution.retried")
        assert retried["detail"]["actor"]["name"] == "tests"

    # Workflows: a new version, and the diff between the two.
    fetch["url"] = f"{target.url}/flaky/v2"
    client.publish("flaky", flaky)
    browser.get(f"{api}/ui/workflows")
    browser.find_element(By.LINK_TEXT, "flaky").click()
    diff = until(browser, lambda d: d.find_element(By.ID, "diff-text"))
    # Structural: the one value that changed, with its path, not a block of moved lines.
    (changed,) = diff.find_elements(By.CSS_SELECTOR, "span.change")
    assert ".request.url" in changed.text and "/flaky/v2" in changed.text, changed.text
    shot(browser, tmp_path, "workflow")


def test_a_read_only_key_sees_no_action_and_posts_without_a_csrf_token_are_refused(
    browser: WebDriver, api: str, api_key: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    client = Api(api, api_key)
    client.publish(
        "idle",
        unsigned([{"id": "later", "type": "delay", "duration_s": 3600}]),
    )
    eid = client.start("idle", {})  # no worker: it stays queued, cancellable by a writer
    _, viewer = apikeys.create(db, "viewer", read_only=True)

    sign_in(browser, api, viewer)
    assert listed(browser) == [eid]
    assert not browser.find_elements(By.ID, "bulk-retry")
    browser.get(f"{api}/ui/executions/{eid}")
    assert browser.find_element(By.ID, "execution-status").text == "queued"
    assert not browser.find_elements(By.CSS_SELECTOR, "main form")
    shot(browser, tmp_path, "read-only-execution")

    # A forged POST with the read-only session's own cookie and CSRF token: refused.
    forged = requests.Session()
    forged.cookies.set("ff_console", browser.get_cookie("ff_console")["value"])
    csrf = CSRF.search(browser.page_source).group(1)
    r = forged.post(f"{api}/ui/executions/{eid}/cancel", data={"csrf": csrf}, timeout=10)
    assert r.status_code == 403
    assert client.execution(eid)["status"] == "queued"

    # Behind nginx on TLS (X-Forwarded-Proto from 127.0.0.1, gunicorn's trusted proxy
    # address) the cookies are Secure; over plain HTTP they cannot be.
    tls = requests.get(f"{api}/ui/signin", headers={"X-Forwarded-Proto": "https"}, timeout=10)
    assert "Secure" in tls.headers["Set-Cookie"] and "SameSite=Strict" in tls.headers["Set-Cookie"]
    plain = requests.get(f"{api}/ui/signin", timeout=10)
    assert "Secure" not in plain.headers["Set-Cookie"]

    # A key that may cancel, without the CSRF token: refused; with it: done.
    writer = requests.Session()
    page = writer.get(f"{api}/ui/signin", timeout=10)
    token = CSRF.search(page.text).group(1)
    r = writer.post(f"{api}/ui/signin", data={"csrf": token, "api_key": api_key}, timeout=10)
    assert r.status_code == 200 and r.url.endswith("/ui/executions")
    csrf = CSRF.search(r.text).group(1)
    r = writer.post(f"{api}/ui/executions/{eid}/cancel", timeout=10, allow_redirects=False)
    assert r.status_code == 403
    assert client.execution(eid)["status"] == "queued"
    r = writer.post(
        f"{api}/ui/executions/{eid}/cancel", data={"csrf": csrf}, timeout=10, allow_redirects=False
    )
    assert r.status_code == 303
    assert client.execution(eid)["status"] == "cancelled"


PHONE = (390, 844)


def fits(driver: WebDriver) -> dict[str, float]:
    """What overflows the viewport: the page's own width, and Sign out's right edge."""
    return driver.execute_script(
        """
        const out = {page: document.documentElement.scrollWidth, view: window.innerWidth};
        const signout = document.querySelector('header.top .who button');
        out.signout = signout ? signout.getBoundingClientRect().right : 0;
        return out;
        """
    )


def test_every_page_is_usable_at_a_phones_width(
    browser: WebDriver, api: str, api_key: str, tmp_path: Path
) -> None:
    """At 390 px the page is never wider than the screen, Sign out is on screen, and the
    DAG keeps its size (scrolling sideways in its own box) so its text stays readable."""
    client = Api(api, api_key)
    steps = [
        {"id": f"a_rather_long_step_name_{i}", "type": "delay", "duration_s": 3600}
        for i in range(4)
    ]
    for i in range(1, 4):
        steps[i]["depends_on"] = [steps[i - 1]["id"]]
    client.publish("a-workflow-with-a-long-key", unsigned(steps))
    steps[0]["duration_s"] = 7200
    client.publish("a-workflow-with-a-long-key", unsigned(steps))
    eid = client.start("a-workflow-with-a-long-key", {"customer": {"id": "c" * 60}})
    browser.set_window_size(*PHONE)
    try:
        sign_in(browser, api, api_key)
        pages = {
            "signin": f"{api}/ui/signin",
            "executions": f"{api}/ui/executions",
            "execution": f"{api}/ui/executions/{eid}",
            "attention": f"{api}/ui/attention",
            "workflows": f"{api}/ui/workflows",
            "workflow": f"{api}/ui/workflows/a-workflow-with-a-long-key?a=1&b=2",
            "bulk": f"{api}/ui/bulk?action=cancel",
        }
        for name, url in pages.items():
            browser.get(url)
            until(browser, lambda d: d.find_element(By.TAG_NAME, "main"))
            shot(browser, tmp_path, f"phone-{name}")
            found = fits(browser)
            assert found["view"] <= PHONE[0], found
            assert found["page"] <= found["view"], (name, found)
            assert found["signout"] <= found["view"], (name, found)
        browser.get(pages["execution"])
        dag = until(browser, lambda d: d.find_element(By.ID, "dag"))
        assert dag.rect["width"] >= int(dag.get_attribute("width")) - 1  # not shrunk
    finally:
        browser.set_window_size(1280, 1000)


LIST_GEOMETRY = """
const rows = [...document.querySelectorAll('#executions tbody tr')];
const cell = (row, name) => row.querySelector('td.' + name);
return {
  view: window.innerWidth,
  page: document.documentElement.scrollWidth,
  header: document.querySelector('#executions thead tr').getBoundingClientRect().height,
  rows: rows.map(row => ({
    id: cell(row, 'id').querySelector('a').title,
    first: row.querySelector('td').className,
    height: row.getBoundingClientRect().height,
    status: cell(row, 'status').getBoundingClientRect().toJSON(),
    key: cell(row, 'key').title,
    key_cut: cell(row, 'key').scrollWidth > cell(row, 'key').clientWidth,
    error_width: cell(row, 'error-snippet').getBoundingClientRect().width,
  })),
};
"""


def test_the_executions_list_is_one_line_per_execution_on_a_phone_and_a_desktop(
    browser: WebDriver,
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    tmp_path: Path,
) -> None:
    """Issue 43: at 390 px the status is the first column and on screen, and at 390 and
    1280 px every execution is one line, however long its idempotency key and error: the
    key is cut, its whole value in the title (and on the execution's page), and at 1280
    px the error keeps a readable width."""
    client = Api(api, api_key)
    broken = [{"id": "shape", "type": "transform", "output": "{{ input.a.b.c.d }}"}]
    client.publish("a-rather-long-workflow-key-for-a-narrow-screen", unsigned(broken))
    workers()
    keys = [f"order-{n}-" + "0123456789abcdef" * 14 for n in range(3)]
    started = [
        client.start(
            "a-rather-long-workflow-key-for-a-narrow-screen",
            {"a": 1},
            headers={"Idempotency-Key": key},
        )
        for key in keys
    ]
    for eid in started:
        client.wait(eid, "failed")
    sign_in(browser, api, api_key)
    try:
        for width in (PHONE[0], 1280):
            browser.set_window_size(width, 900)
            browser.get(f"{api}/ui/executions")
            until(browser, lambda d: d.find_element(By.ID, "executions"))
            shot(browser, tmp_path, f"list-{width}")
            found = browser.execute_script(LIST_GEOMETRY)
            assert found["page"] <= found["view"], found  # the table scrolls in its own box
            rows = {row["id"]: row for row in found["rows"]}
            assert set(started) <= set(rows), found
            for eid, key in zip(started, keys, strict=True):
                row = rows[eid]
                assert row["first"] == "status", row
                assert row["status"]["left"] >= 0 and row["status"]["right"] <= found["view"], row
                assert row["height"] <= found["header"] * 1.6, (width, row, found["header"])
                assert row["key"] == key and row["key_cut"], row
                if width == 1280:
                    assert row["error_width"] >= 200, row
        browser.get(f"{api}/ui/executions/{started[0]}")
        assert keys[0] in browser.find_element(By.CSS_SELECTOR, "dl.facts").text
    finally:
        browser.set_window_size(1280, 1000)


def test_the_list_tells_how_each_started_and_ended_and_a_schedule_is_run_from_its_page(
    browser: WebDriver,
    api: str,
    api_key: str,
    workers: Callable[..., Process],
    tmp_path: Path,
) -> None:
    """The list's trigger, age (absolute time on hover), duration and error, and a search
    by a pasted id prefix; a delay drawn on the timeline; a schedule paused, resumed,
    triggered and backfilled (dry run, then confirmed) from its page; all at a desktop's
    width and, for the pages involved, at a phone's."""
    client = Api(api, api_key)
    broken = [{"id": "shape", "type": "transform", "output": "{{ input.a.b }}"}]
    client.publish("brittle", unsigned(broken))
    client.publish("nap", unsigned([{"id": "nap", "type": "delay", "duration_s": 3600}]))
    sweep = {
        "name": "Sweep",
        "trigger": {"schedule": {"every_s": 3600}},
        "steps": [{"id": "note", "type": "transform", "output": {"n": 1}}],
    }
    client.publish("sweep", sweep)
    workers()
    failed = client.start("brittle", {"a": 1})
    napping = client.start("nap", {})
    client.wait(failed, "failed")
    client.wait(napping, "waiting")

    sign_in(browser, api, api_key)
    row = until(browser, lambda d: d.find_element(By.XPATH, f"//a[@title='{failed}']/../.."))
    cells = {c.get_attribute("class"): c for c in row.find_elements(By.TAG_NAME, "td")}
    assert cells["trigger"].text == "webhook"
    assert re.fullmatch(r"[\d.]+ (ms|s|min) ago|just now|\d+ min \d+ s ago", cells["created"].text)
    title = cells["created"].find_element(By.TAG_NAME, "time").get_attribute("title")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z", title)
    assert re.fullmatch(r"[\d.]+ (ms|s)", cells["took"].text)
    assert "it has no 'b'" in cells["error-snippet"].text
    nap_row = browser.find_element(By.XPATH, f"//a[@title='{napping}']/../..")
    assert nap_row.find_element(By.CLASS_NAME, "took").text.endswith("…")  # still running

    # A pasted prefix, dashes and all, finds it.
    box = browser.find_element(By.ID, "f-id")
    box.send_keys(failed[:18].upper())
    browser.find_element(By.ID, "apply").click()
    until(browser, lambda d: "id=" in d.current_url)
    assert failed in listed(browser) and napping not in listed(browser)
    shot(browser, tmp_path, "list-by-id")

    browser.get(f"{api}/ui/executions/{napping}")
    delay = until(browser, lambda d: d.find_element(By.CSS_SELECTOR, "rect[data-kind=delay]"))
    assert (
        delay.find_element(By.TAG_NAME, "title")
        .get_attribute("textContent")
        .startswith("nap: delay, ")
    )

    # The schedule, from its page.
    browser.get(f"{api}/ui/workflows/sweep")
    browser.find_element(By.ID, "pause-schedule").click()
    until(browser, lambda d: d.find_element(By.ID, "resume-schedule"))
    assert "paused" in browser.find_element(By.ID, "schedule-state").text
    schedule = client.session.get(f"{api}/api/v1/workflows/sweep/schedule", timeout=10)
    assert schedule.json()["paused"]
    browser.find_element(By.ID, "resume-schedule").click()
    until(browser, lambda d: d.find_element(By.ID, "pause-schedule"))
    browser.find_element(By.ID, "trigger-schedule").click()
    until(browser, lambda d: d.find_element(By.ID, "execution-status"))
    assert "/ui/executions/" in browser.current_url

    browser.get(f"{api}/ui/workflows/sweep")
    hours_ago = browser.execute_script(
        "const at = h => new Date(Date.now() - h * 3600e3).toISOString().slice(0, 19);"
        "document.getElementById('backfill-from').value = at(3.5);"
        "document.getElementById('backfill-to').value = at(0.02);"
        "return 1;"
    )
    assert hours_ago == 1
    browser.find_element(By.ID, "backfill-preview").click()
    until(browser, lambda d: d.find_element(By.ID, "backfill-ticks"))
    would = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#backfill-ticks td.outcome")]
    assert would.count("would fire") >= 3
    browser.set_window_size(*PHONE)
    try:
        shot(browser, tmp_path, "phone-backfill-preview")
        found = fits(browser)
        assert found["page"] <= found["view"] and found["signout"] <= found["view"], found
        browser.find_element(By.ID, "backfill-confirm").click()
        until(browser, lambda d: d.find_element(By.ID, "back-to-workflow"))
        fired = [
            c.text for c in browser.find_elements(By.CSS_SELECTOR, "#backfill-ticks td.outcome")
        ]
        assert fired.count("fired") == would.count("would fire"), fired
        for url in (
            f"{api}/ui/workflows/sweep",
            f"{api}/ui/executions",
            f"{api}/ui/executions/{napping}",
        ):
            browser.get(url)
            until(browser, lambda d: d.find_element(By.TAG_NAME, "main"))
            found = fits(browser)
            assert found["page"] <= found["view"], (url, found)
            assert found["signout"] <= found["view"], (url, found)
        shot(browser, tmp_path, "phone-execution-with-delay")
        timeline = browser.find_element(By.ID, "timeline")
        assert timeline.rect["width"] >= int(timeline.get_attribute("width")) - 1  # not shrunk
    finally:
        browser.set_window_size(1280, 1000)
