"""Debian's Chromium driven by Selenium, as the page's browser tests use it, and their screenshots."""

from __future__ import annotations

from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.remote.webdriver import WebDriver

from tests.paths import REPO

ARTIFACTS = REPO / "test-artifacts"


def chromium(*, javascript: bool = True) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    # As root, headless, and with the background networking off: this machine's network is closed.
    flags = "--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-quic --no-first-run"
    flags += (
        " --disable-background-networking --disable-component-update --disable-sync --window-size=1400,1800"
    )
    if not javascript:
        flags += " --blink-settings=scriptEnabled=false"
    for flag in flags.split():
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=ChromeService("/usr/bin/chromedriver"))


def shot(driver: WebDriver, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / name))


def log_in(driver: WebDriver, base_url: str, token: str, *, then: str = "/?refresh_s=0") -> None:
    """Log in through the page's own form (paste the token), as a person does; then open `then`."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base_url + "/?refresh_s=0")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    # logged in once the API set its cookie (the page then reloads itself: no element is read meanwhile)
    WebDriverWait(driver, 30).until(lambda d: d.get_cookie("gpuhealth_token") is not None)
    driver.get(base_url + then)
    assert "anonymous" not in (driver.find_element(By.TAG_NAME, "body").get_attribute("class") or "")


def with_cookie(driver: WebDriver, base_url: str, token: str) -> None:
    """The page's login cookie, set without its script (for a browser that runs none)."""
    driver.get(base_url + "/favicon.ico")
    driver.add_cookie(
        {"name": "gpuhealth_token", "value": token, "path": "/", "httpOnly": True, "sameSite": "Strict"}
    )
