"""The console's definition editor (flowforge/api/console/editor.py) in headless Chromium
against a real bin/api: type a draft with an error and see the checker's path, fix it and
see the DAG and the diff against the newest version, then publish with the confirmation."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e.test_console import browser, shot, sign_in, until  # noqa: F401 - fixture
from tests.support.api import Api

ROOT = Path(__file__).resolve().parents[2]
ORDER_SYNC = json.loads((ROOT / "docs" / "examples" / "order-sync.json").read_text())


def _type(driver: WebDriver, document: object) -> None:
    """Replace the draft by typing, as an author does (the script checks on input)."""
    draft = driver.find_element(By.ID, "draft")
    draft.send_keys(Keys.CONTROL, "a")
    draft.send_keys(Keys.DELETE)
    draft.send_keys(json.dumps(document))


def test_type_an_error_see_its_path_fix_it_see_the_dag_and_publish(
    browser: WebDriver,  # noqa: F811 - the fixture imported above
    api: str,
    api_key: str,
    client: Api,
    db: psycopg.Connection,
    tmp_path: Path,
) -> None:
    client.publish("editme", ORDER_SYNC)
    sign_in(browser, api, api_key)
    browser.get(f"{api}/ui/workflows/editme")
    browser.find_element(By.ID, "edit-link").click()
    until(browser, lambda d: d.find_elements(By.ID, "draft"))

    broken = json.loads(json.dumps(ORDER_SYNC))
    broken["steps"][1]["depends_on"] = ["nowhere"]
    _type(browser, broken)
    until(
        browser,
        lambda d: "$.steps[1].depends_on" in d.find_element(By.ID, "checked").text,
    )
    shot(browser, tmp_path, "editor-error")
    assert not browser.find_elements(By.ID, "dag")

    fixed = json.loads(json.dumps(ORDER_SYNC))
    fixed["steps"][1]["duration_s"] = 1
    _type(browser, fixed)
    until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#dag g[data-step="cool_off"]'))
    diff = browser.find_element(By.ID, "diff").text
    assert "~ $.steps[id=cool_off].duration_s: 2 → 1" in diff
    assert len(browser.find_elements(By.CSS_SELECTOR, "#dag g.node")) == len(fixed["steps"])
    shot(browser, tmp_path, "editor-valid")
    assert db.execute("SELECT latest_version FROM workflows WHERE key = 'editme'").fetchone() == (
        1,
    )

    browser.find_element(By.ID, "confirm").click()
    browser.find_element(By.ID, "publish").click()
    until(browser, lambda d: "version=2" in d.current_url)
    shot(browser, tmp_path, "editor-published")
    row = db.execute(
        "SELECT v.definition FROM workflow_versions v JOIN workflows w ON w.id = v.workflow_id"
        " WHERE w.key = 'editme' AND v.version = 2"
    ).fetchone()
    assert row is not None and row[0]["steps"][1]["duration_s"] == 1
