"""The fleet page as an SRE uses it: drawn by the server, readable without colour, clicked in Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from services.remediator.policy import load_policy
from shared.settings.common import DatabaseSettings
from tests.helpers.browser import chromium, log_in, shot, with_cookie
from tests.helpers.identities import VIEWER, as_role, identities
from tests.helpers.remediation import plans_in_every_state


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()


def test_the_first_paint_is_html_from_the_server_with_states_readable_without_colour(
    served_api: str, scored: dict[str, Any]
) -> None:
    html = VIEWER.get(served_api + "/", timeout=30).text
    assert "loading" not in html
    cells = re.findall(r'<span class="cell (\w+)" data-uuid="([^"]+)"[^>]*><b>(.)</b><i>(\d+)</i>', html)
    assert {uuid for _, uuid, _, _ in cells} == set(scored["uuids"])
    marks = {uuid: (state, mark) for state, uuid, mark, _ in cells}
    assert marks[scored["sick"]] == ("unhealthy", "✕")
    assert marks[scored["well"]] == ("healthy", "✓")
    assert '<b id="s-unhealthy">1</b>' in html
    assert re.search(r"<td>gpu-node-00 GPU 1</td><td>memory: volatile_dbe</td>", html), (
        "alert rows name host and GPU"
    )
    driver = chromium(javascript=False)  # what a plain headless screenshot sees
    try:
        driver.get(served_api + "/")  # not logged in: the shell, no fleet
        assert driver.find_elements(By.CSS_SELECTOR, "#grid .cell") == []
        with_cookie(driver, served_api, identities().tokens["viewer"])
        driver.get(served_api + "/")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#grid .cell")) == 4
        assert "✕" in driver.find_element(By.CSS_SELECTOR, f'.cell[data-uuid="{scored["sick"]}"]').text
        shot(driver, "fleet-page-no-javascript.png")
    finally:
        driver.quit()


def test_every_asset_swagger_ui_and_the_favicon_come_from_the_api_itself(served_api: str) -> None:
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=30) as c:
        icon = c.get("/favicon.ico")
        assert icon.status_code == 200
        assert icon.headers["content-type"] == "image/x-icon"
        assert icon.content[:4] == b"\x00\x00\x01\x00"
        for page in ("/", "/docs"):
            html = c.get(page).text
            refs = re.findall(r'(?:src|href)\s*=\s*"([^"]+)"', html) + re.findall(
                r"(?:url|src|href)\s*=?\s*'([^']+)'", html
            )
            assert refs, page
            for ref in refs:
                assert ref.startswith("/"), (page, ref)  # nothing from another host
                assert c.get(ref).status_code == 200, (page, ref)
        docs = c.get("/docs").text
        assert "/static/swagger-ui/swagger-ui-bundle.js" in docs
        assert "SwaggerUIBundle" in c.get("/static/swagger-ui/swagger-ui-bundle.js").text
        assert c.get("/redoc").status_code == 404  # its default loads from a CDN


def test_an_sre_filters_opens_a_faulted_gpu_reads_its_evidence_and_acknowledges_its_alert(
    served_api: str, scored: dict[str, Any], browser: WebDriver
) -> None:
    # The page redraws the detail after an acknowledge and on its live refresh: an element read
    # mid-redraw is stale, so the waits look again rather than fail.
    wait = WebDriverWait(
        browser, 30, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
    )
    # Logged in as an operator, through the page's form; no timed refresh while the test reads the
    # page (acknowledging still redraws it).
    browser.get(served_api + "/?refresh_s=0")
    assert "log in" in browser.find_element(By.ID, "login").text  # the shell, before logging in
    assert not browser.find_element(By.ID, "grid").is_displayed()
    log_in(browser, served_api, identities().tokens["operator"])
    wait.until(lambda d: "live" in d.find_element(By.ID, "s-updated").text)
    # the remediator's state and its plans (none yet) are on the page too
    assert browser.find_element(By.ID, "remediator").text == (
        "live: running, breaker closed · dry run: running, breaker closed"
    )
    assert browser.find_element(By.CSS_SELECTOR, "#remediations tbody").text == "none"
    shot(browser, "fleet-page-1-live.png")

    def visible(d: WebDriver) -> list[Any]:
        return [c for c in d.find_elements(By.CSS_SELECTOR, "#grid .cell") if c.is_displayed()]

    Select(browser.find_element(By.ID, "state-filter")).select_by_value("unhealthy")
    assert [c.get_attribute("data-uuid") for c in visible(browser)] == [scored["sick"]]
    Select(browser.find_element(By.ID, "state-filter")).select_by_value("")
    browser.find_element(By.ID, "filter").send_keys("no-such-host")
    assert visible(browser) == []
    browser.find_element(By.ID, "filter").clear()
    browser.find_element(By.ID, "filter").send_keys("gpu-node-00 H100")
    assert len(visible(browser)) == 4

    browser.find_element(By.CSS_SELECTOR, f'#grid .cell[data-uuid="{scored["sick"]}"]').click()
    wait.until(lambda d: d.find_element(By.ID, "detail").get_attribute("data-loaded") == scored["sick"])
    assert "memory: unhealthy (volatile_dbe)" in browser.find_element(By.ID, "d-summary").text
    memory = browser.find_element(By.CSS_SELECTOR, '#d-verdicts tr[data-subsystem="memory"]').text
    assert "unhealthy" in memory
    assert "dbe_volatile=1" in memory  # the evidence
    assert "reset_gpu" in memory  # the recommended action
    charts = {
        c.get_attribute("data-metric"): c for c in browser.find_elements(By.CSS_SELECTOR, "#d-charts .chart")
    }
    assert {"temp_c", "power_w", "util_pct", "ecc_sbe", "ecc_dbe", "xid_last"} <= set(charts)
    dbe_line = charts["ecc_dbe"].find_element(By.TAG_NAME, "polyline").get_attribute("points") or ""
    assert len(dbe_line.split()) > 10
    ticks = [t.text for t in charts["ecc_dbe"].find_elements(By.CSS_SELECTOR, "text.tick")]
    assert len(ticks) == 5
    assert all(re.fullmatch(r"\d\d:\d\d", t) for t in ticks)  # a time axis
    history = browser.find_element(By.ID, "d-history").text
    assert "volatile_dbe" in history
    shot(browser, "fleet-page-2-faulted-gpu.png")

    row = "#d-alerts tr[data-alert] button.ack"
    listed = VIEWER.get(served_api + "/api/v1/alerts", params={"gpu": scored["sick"]}).json()["alerts"]
    (alert_id,) = [a["id"] for a in listed if a["kind"] == "unhealthy_memory"]
    button = browser.find_element(By.CSS_SELECTOR, f'#d-alerts tr[data-alert="{alert_id}"] button.ack')
    browser.execute_script(
        "sessionStorage.setItem('gpuhealth-token', arguments[0])", identities().tokens["viewer"]
    )
    button.click()  # a viewer may not acknowledge
    wait.until(lambda d: "refused" in d.find_element(By.ID, "ack-result").text)
    assert "403" in browser.find_element(By.ID, "ack-result").text
    shot(browser, "fleet-page-3-ack-refused.png")
    browser.execute_script(
        "sessionStorage.setItem('gpuhealth-token', arguments[0])", identities().tokens["operator"]
    )
    browser.find_element(By.CSS_SELECTOR, f'#d-alerts tr[data-alert="{alert_id}"] button.ack').click()
    wait.until(lambda d: "acknowledged" in d.find_element(By.ID, "ack-result").text)
    assert "gpu-node-00" in browser.find_element(By.ID, "ack-result").text
    wait.until(
        lambda d: (
            "acknowledged by local-operator"
            in d.find_element(By.CSS_SELECTOR, f'#d-alerts tr[data-alert="{alert_id}"]').text
        )
    )
    shot(browser, "fleet-page-4-acknowledged.png")
    stored = VIEWER.get(
        served_api + "/api/v1/alerts", params={"gpu": scored["sick"], "state": "acknowledged"}
    ).json()
    assert [(a["id"], a["acknowledged_by"]) for a in stored["alerts"]] == [(alert_id, "local-operator")]
    assert len(browser.find_elements(By.CSS_SELECTOR, row)) == 1  # the XID alert is still open to acknowledge


def test_the_lifecycle_panel_is_drawn_by_the_server_and_opens_the_gpu_it_names(
    served_api: str, scored: dict[str, Any], browser: WebDriver, lifecycle_decided: dict[str, Any]
) -> None:
    html = VIEWER.get(served_api + "/", timeout=30).text
    said = re.search(r'<p id="lc-said">(.*?)</p>', html, re.S)
    assert said is not None
    acting = {u: d for u, d in lifecycle_decided.items() if d["decision"] != "keep"}
    assert scored["sick"] in acting, lifecycle_decided  # the GPU with a double-bit error is not kept
    for uuid in acting:
        assert f'<tr data-uuid="{uuid}">' in html
    assert "GPU" in said.group(1)
    assert 'href="/api/v1/lifecycle/export.csv"' in html

    log_in(browser, served_api, identities().tokens["viewer"])
    wait = WebDriverWait(
        browser, 30, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
    )
    wait.until(lambda d: "live" in d.find_element(By.ID, "s-updated").text)
    browser.find_element(By.CSS_SELECTOR, f'#lc-table tr[data-uuid="{scored["sick"]}"]').click()
    wait.until(lambda d: d.find_element(By.ID, "detail").get_attribute("data-loaded") == scored["sick"])
    detail = browser.find_element(By.ID, "d-lifecycle").text
    assert detail.startswith(f"{acting[scored['sick']]['decision']}: ")
    assert "missing: " in detail  # no inventory file: the warranty, the price, ... are listed
    shot(browser, "fleet-page-5-lifecycle.png")


def test_the_page_shows_pending_running_and_failed_plans_and_the_open_breaker(
    served_api: str, migrated: DatabaseSettings, browser: WebDriver
) -> None:
    plans_in_every_state(migrated, load_policy())
    log_in(browser, served_api, identities().tokens["viewer"])
    WebDriverWait(browser, 30).until(lambda d: "live" in d.find_element(By.ID, "s-updated").text)
    assert browser.find_element(By.ID, "remediator").text == (
        "live: running, breaker open (4 nodes taken out within 900 s (at most 4))"
        " · dry run: running, breaker closed"
    )
    plans = {
        tr.get_attribute("data-plan"): [td.text for td in tr.find_elements(By.TAG_NAME, "td")][:5]
        for tr in browser.find_elements(By.CSS_SELECTOR, "#remediations tbody tr")
    }
    assert plans == {
        "1": ["1", "running", "gpu-node-00", "reset_gpu", "cordon"],
        "2": ["2", "held (approval)", "gpu-node-01", "reboot_node", "cordon"],
        "3": ["3", "failed", "gpu-node-02", "reset_gpu", "drain"],
    }
    shot(browser, "fleet-page-remediations.png")
