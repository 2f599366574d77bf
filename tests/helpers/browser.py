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
