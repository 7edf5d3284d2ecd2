"""The dashboard in a real headless Chromium against a real embedded stack: a registered model,
queries, the scaler's ticks and an offline job over emulated S3 must all show on the page, with
no error in the browser's console. A screenshot of it goes to the test artifacts
(``MODELLESS_TEST_ARTIFACTS``, else tests/artifacts/).

The browser is Debian's chromium (scripts/lib.sh: ``ensure_chromium``), driven through the
driver the playwright wheel bundles: nothing is downloaded (``playwright install`` is never run).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Page, sync_playwright

from modelless.client import Client
from tests.e2e.conftest import start_stack
from tests.models import digits, linear_model, valset_npz
from tests.offline_kit import npy
from tests.waiting import scaled, wait_for

CHROMIUM = Path(os.environ.get("MODELLESS_CHROMIUM", "/usr/bin/chromium"))
# Headless, and nothing that reaches out of the machine (updates, sync, QUIC probes).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
APP = "dash"
MODEL = "linear"
JOB_INPUTS = 12

# What the page has yet to show, in words (empty once every section shows the stack's data).
MISSING_ON_PAGE = """
([model, jobId]) => {
  const missing = [];
  const q = (selector) => document.querySelector(selector);
  if (!q(`#models-table tr[data-model="${model}"]`)) missing.push("the model's row");
  if (document.querySelectorAll("#scatter circle.point").length === 0) missing.push("scatter points");
  if (document.querySelectorAll("#workers-table tbody tr[data-worker]").length === 0) missing.push("workers");
  const cost = (q("#plan-cost") || {}).textContent || "";
  if (q("#plan-body").hidden || !/^\\$\\d/.test(cost)) missing.push("plan cost");
  const line = q(`#load-charts .spark[data-series="${model}"] polyline`);
  const counts = line ? line.getAttribute("points").split(" ").map((p) => parseFloat(p.split(",")[1])) : [];
  if (counts.length < 2 || Math.min(...counts) === Math.max(...counts)) missing.push("load over time");
  if (!q(`#jobs-table tr[data-job="${jobId}"] .bar span`)) missing.push("the offline job");
  return missing;
}
"""


def artifacts_dir() -> Path:
    configured = os.environ.get("MODELLESS_TEST_ARTIFACTS")
    directory = Path(configured) if configured else Path(__file__).resolve().parents[1] / "artifacts"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
def chromium() -> Path:
    if not os.access(CHROMIUM, os.X_OK):
        message = f"no chromium at {CHROMIUM}: scripts/test installs it (ensure_chromium)"
        if os.environ.get("MODELLESS_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest.fixture
def browser_page(chromium: Path) -> Iterator[tuple[Page, list[str]]]:
    """A page in a fresh headless Chromium, and the errors its console and scripts report."""
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text} ({message.location})")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", on_console)
            page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
            yield page, errors
        finally:
            browser.close()


def test_dashboard_shows_models_workers_plan_load_and_jobs(
    tmp_path: Path, s3_bucket: str, browser_page: tuple[Page, list[str]]
) -> None:
    import boto3

    page, errors = browser_page
    stack = start_stack(tmp_path / "state", "memory://")  # the environment's AWS endpoint: moto's
    try:
        admin = Client(stack.url, admin_key=stack.admin_key)
        key = admin.create_app(APP, offline_buckets=[s3_bucket])
        client = Client(stack.url, api_key=key)
        registration = client.register_model(MODEL, linear_model(), valset_npz(), app_id=APP)
        done = client.wait_for_registration(registration["registrationId"], timeout_s=scaled(300))
        assert done["status"] == "ready", done

        s3 = boto3.client("s3")
        images = digits()[0]
        for index in range(JOB_INPUTS):
            s3.put_object(Bucket=s3_bucket, Key=f"in/item-{index:03d}.npy", Body=npy(images[index]))
        job = client.offline_query(f"s3://{s3_bucket}/in/", f"s3://{s3_bucket}/out/", APP, model_name=MODEL)

        page.goto(f"{stack.url}/dashboard#key={stack.admin_key}")
        assert "#key=" not in page.url  # the key left the address bar for localStorage

        sent = 0

        def missing_while_querying() -> list[str]:
            # Queries go on while the page polls: a gateway hands its counts to the store once a
            # second, on a query, so the load chart fills only while queries arrive.
            nonlocal sent
            client.online_query(images[sent % len(images)], APP, model_name=MODEL)
            sent += 1
            shown: list[str] = page.evaluate(MISSING_ON_PAGE, [f"{APP}/{MODEL}", job["jobId"]])
            return shown

        wait_for(
            missing_while_querying,
            90.0,
            "every section of the dashboard to show data",
            0.25,
            until=lambda m: not m,
        )

        points = page.locator("#scatter circle.point").count()
        assert points == len(client.variants(MODEL))
        assert page.locator("#status").get_attribute("data-state") == "ok"
        assert page.locator("#scope").text_content() == "admin: every app"
        screenshot = artifacts_dir() / "dashboard.png"
        page.screenshot(path=str(screenshot), full_page=True)
        print(f"dashboard screenshot: {screenshot}")
        assert errors == []
    finally:
        page.close()  # no poll may reach the stack while it stops
        assert stack.stop() == 0
