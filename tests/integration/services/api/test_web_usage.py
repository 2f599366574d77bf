"""The fleet page's usage view in Chromium: a week's GPU-hours by class, by namespace and per day, in words.

The fleet (tests/helpers/usage_fleet.py's hand_fleet) ran in the last hours: GPU 1
trained in namespace ml for an hour; GPU 2 held pod web-0 idle for half an hour,
went silent, then ran unlabelled for half an hour. Every figure must be readable as
text (no colour needed) and be the usage API's own.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.browser import chromium, log_in, shot, with_cookie
from tests.helpers.identities import VIEWER, as_role, identities
from tests.helpers.usage_fleet import hand_fleet, store


@pytest.fixture
def used(served_api: str, migrated: DatabaseSettings) -> str:
    t0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    with connect(migrated) as conn:
        store(conn, hand_fleet(), t0)
    return served_api


def cells(driver: WebDriver, table: str) -> dict[str, list[str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
    return {r.find_element(By.TAG_NAME, "td").text: [td.text for td in r.find_elements(By.TAG_NAME, "td")[1:]]
            for r in rows}  # fmt: skip


@pytest.mark.parametrize("javascript", [True, False])
def test_the_usage_view_says_a_weeks_gpu_hours_by_class_namespace_and_day_in_words(
    used: str, javascript: bool
) -> None:
    api = VIEWER.get(used + "/api/v1/usage", params={"by": "namespace"}, timeout=30).json()
    assert api["total"]["gpu_hours"] == pytest.approx(2.0)
    driver = chromium(javascript=javascript)
    try:
        if javascript:
            log_in(driver, used, identities().tokens["viewer"])
        else:
            with_cookie(driver, used, identities().tokens["viewer"])
            driver.get(used + "/?refresh_s=0")
        said = driver.find_element(By.ID, "u-said").text
        assert said.startswith(
            "2.0 GPU-hours on 2 GPUs; busy 75.0 %; idle while allocated 25.0 % (0.5 GPU-hours)"
        )
        kwh = api["total"]["energy_kwh"]
        assert said.endswith(f"; {kwh:,.1f} kWh from the energy counters")
        # class, GPU-hours, share of all, busy, idle while allocated: all as text
        assert cells(driver, "u-classes") == {
            "training": ["1.0", "50.0 %", "100.0 %", "0.0 %"],
            "inference": ["0.5", "25.0 %", "0.0 %", "100.0 %"],
            "none": ["0.5", "25.0 %", "100.0 %", "0.0 %"],
        }
        assert cells(driver, "u-namespaces") == {
            "ml": ["1.0", "50.0 %", "100.0 %", "0.0 %"],
            "web": ["0.5", "25.0 %", "0.0 %", "100.0 %"],
            "(no namespace)": ["0.5", "25.0 %", "100.0 %", "0.0 %"],
        }
        days = cells(driver, "u-days")
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\d", day) for day in days)
        assert sum(float(row[1]) for row in days.values()) == pytest.approx(2.0, abs=0.1)
        # every bar says what it shows; none is only a colour
        bars = driver.find_elements(By.CSS_SELECTOR, "#usage .ubar")
        assert bars
        labels = [b.get_attribute("aria-label") or "" for b in bars]
        assert all(re.search(r"\d", label) for label in labels), labels
        assert any(re.fullmatch(r"training: [01]\.\d GPU-hours", label) for label in labels), labels
        assert "training: 50.0 % of the GPU-hours" in labels
        shot(driver, f"fleet-page-usage{'' if javascript else '-no-javascript'}.png")
    finally:
        driver.quit()


def test_the_usage_views_links_export_the_week(used: str) -> None:
    html = VIEWER.get(used + "/", timeout=30).text
    links = re.findall(r'href="(/api/v1/usage/export[^"]+)"', html)
    assert len(links) == 2
    with httpx.Client(headers=as_role("viewer"), base_url=used, timeout=30) as c:
        as_csv = c.get(links[0])
        assert as_csv.status_code == 200
        assert as_csv.text.splitlines()[0].startswith("from,to,by,period,kind,key,gpus,gpu_hours")
        assert c.get(links[1]).headers["content-type"] == "application/vnd.apache.parquet"
