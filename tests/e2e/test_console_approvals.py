"""An approval form (docs/contract.md#approvals) in headless Chromium against a real bin/api
and bin/worker: the approval is listed for the signed-in user, its form is filled and
approved without any script, and the execution goes on with the values and who decided,
while a tab left open on the execution shows it finish without a reload."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from tests.e2e.test_console import browser, shot, sign_in, until  # noqa: F401 - fixture
from tests.integration.test_approvals import REFUND
from tests.support.api import Api, step
from tests.support.processes import Process


def test_fill_and_approve_a_form_and_the_execution_goes_on(
    browser: WebDriver,  # noqa: F811 - the fixture imported above
    api: str,
    api_key: str,
    client: Api,
    workers: Callable[..., Process],
    tmp_path: Path,
) -> None:
    workers()
    client.publish("refund", REFUND)
    execution_id = client.start("refund", {"order": 7})
    client.until(
        lambda: step(client.execution(execution_id), "approve")["status"] == "waiting",
        30,
        "the approval waits",
    )
    sign_in(browser, api, api_key)
    # A colleague's tab left open on the execution follows it live: marked, it must show
    # the decision's outcome without a reload.
    browser.get(f"{api}/ui/executions/{execution_id}")
    assert browser.find_element(By.ID, "execution-status").text == "waiting"
    browser.execute_script("window.stillThisPage = true;")
    watching = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(f"{api}/ui/")
    browser.find_element(By.LINK_TEXT, "Approvals").click()
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#approvals a.approval-link"))
    browser.find_element(By.CSS_SELECTOR, "#approvals a.approval-link").click()
    until(browser, lambda d: d.find_elements(By.ID, "approval-form"))

    browser.find_element(By.ID, "field-amount").send_keys("42")
    browser.find_element(By.ID, "field-reason").send_keys("damaged")
    Select(browser.find_element(By.ID, "field-channel")).select_by_visible_text("Cash")
    browser.find_element(By.ID, "field-notify").click()
    shot(browser, tmp_path, "approval-form")
    browser.find_element(By.ID, "approve").click()
    until(browser, lambda d: "decided=" in d.current_url)
    assert browser.find_elements(By.ID, "no-approvals")

    done = client.wait(execution_id, timeout=30)
    assert done["status"] == "succeeded"
    output = step(done, "approve")["output"]
    assert output["values"] == {"amount": 42, "reason": "damaged", "channel": "cash",
                                "notify": True}  # fmt: skip
    assert output["decided_by"] == "tests"
    browser.switch_to.window(watching)
    until(browser, lambda d: d.find_element(By.ID, "execution-status").text == "succeeded")
    assert browser.execute_script("return window.stillThisPage === true;")
    browser.get(f"{api}/ui/executions/{execution_id}")
    until(browser, lambda d: d.find_elements(By.ID, "decided-approve"))
    assert "tests" in browser.find_element(By.ID, "decided-approve").text
    shot(browser, tmp_path, "approval-decided")
