"""The browser the report's page tests drive (tests/test_report.py, tests/test_turn_records.py)."""

from __future__ import annotations

import os
import shutil

import pytest


def browser():
    """Headless Chromium through Selenium and the system's chromedriver (nothing is downloaded). Where
    either is missing the test skips, saying so — except under CI (.ci/run installs them), where it fails."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if not (chromium and driver and webdriver):
        missing = ", ".join(n for n, ok in (("chromium", chromium), ("chromedriver", driver),
                                            ("selenium", webdriver)) if not ok)
        reason = f"{missing} not installed (apt-get install chromium chromium-driver; pip install selenium)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"CI must run the browser test: {reason}")
        pytest.skip(reason)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(driver))
