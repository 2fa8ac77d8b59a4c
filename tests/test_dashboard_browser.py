"""The dashboard in a real browser: headless Chromium (the distribution's package, found
on PATH; .ci/run installs it) driven by playwright, against a colony started with the CLI.

The README's screenshot comes from a busier colony: ``python -m tests.dashboard_shot``.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshant import Client

from .conftest import Procs, wait_for

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and not os.environ.get("CI"):
    pytest.skip("no chromium on PATH (apt-get install chromium); CI installs it",
                allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api") if not os.environ.get("CI") else (
    __import__("playwright.sync_api").sync_api)

TOKEN = "browser-test-token"


@pytest.fixture
def browser() -> Iterator[Any]:
    assert CHROMIUM is not None, "CI must have chromium (see .ci/run)"
    with playwright_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=["--no-sandbox", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()


def _colony(procs: Procs, *http: str) -> tuple[str, str]:
    _, info = procs.start("queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                          "--json", "--hb-interval", "0.2", "--http", "127.0.0.1:0",
                          *(http or ("--http-token", TOKEN)))
    assert info["http"].startswith("http://127.0.0.1:"), info
    for name in ("web-ant-1", "web-ant-2"):
        procs.forager(info["router"], "--name", name, "--slots", "2",
                      "--label", "zone=lab")
    return info["router"], info["http"]


def test_dashboard_live_in_chromium(procs: Procs, browser: Any, tmp_path: Path) -> None:
    endpoint, url = _colony(procs)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(15_000)
    page.goto(url)
    # Forager names appear, pushed by the live feed (no reload).
    page.wait_for_selector("#foragers tr[data-name='web-ant-1']")
    page.wait_for_selector("#foragers tr[data-name='web-ant-2']")
    assert page.locator("#live").inner_text() == "live"
    assert page.locator("#role").inner_text() == "leader"
    # A schedule shows with its next tick (local time), and counts its firings.
    with Client(endpoint) as c:
        c.add_schedule("web-digest", "*/2 * * * * *", "echo", {"d": 1})
    row = page.locator("#schedules tr", has_text="web-digest")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "*/2 * * * * *" and cells[2] == "echo" and ":" in cells[3], cells
    wait_for(lambda: int(row.locator("td").nth(4).inner_text().split()[0]) >= 1, 15,
             "the schedule's first firing on the dashboard")
    assert page.locator("#schedules-count").inner_text() == "(1)"

    stop = threading.Event()
    done: list[int] = []

    def work() -> None:
        with Client(endpoint) as c:
            while not stop.is_set():
                futs = [c.submit("sleep", {"seconds": 0.05}) for _ in range(8)]
                for f in futs:
                    f.result(30)
                done.append(len(futs))

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        def completed() -> int:
            return int(page.locator("#stat-completed").inner_text())

        first = wait_for(completed, 20, "a completed task on the dashboard")
        # It keeps rising while tasks run, without reloading the page.
        wait_for(lambda: completed() >= first + 16, 20, "the completed count to rise")
        page.wait_for_selector("#running tr[data-task]", timeout=15_000)
        # A running task's run time beside its age since submission.
        cells = page.locator("#running tr[data-task]").first.locator("td").all_inner_texts()
        assert cells[4].endswith(("ms", " s")) and cells[5].endswith(("ms", " s")), cells
        # Charts with axes (values with units, how long ago) and a legend per series.
        wait_for(lambda: "p99" in page.locator("#legend-latency").inner_text(), 10,
                 "the latency legend")
        ticks = page.locator("#chart-latency text.tick").all_text_contents()
        assert "now" in ticks and any(t.endswith(("ms", " s")) for t in ticks), ticks
        assert any(t.endswith("/s") for t in
                   page.locator("#chart-throughput text.tick").all_text_contents())
        assert "queued" in page.locator("#legend-queue").inner_text()
        assert page.locator("#legend-queue .swatch").count() == 2
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        if os.environ.get("MESHANT_SHOT"):  # to look at it: MESHANT_SHOT=/tmp/x.png
            page.screenshot(path=os.environ["MESHANT_SHOT"], full_page=True)
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive() and done

    # Clicking a finished task shows its audit timeline.
    # (The list re-renders as tasks finish: the row is found again by its task id.)
    task_id = page.locator("#recent tr[data-task]").first.get_attribute("data-task")
    page.locator(f"#recent tr[data-task='{task_id}']").click()
    page.wait_for_selector("#task-detail:not([hidden])")
    assert page.locator("#detail-id").inner_text() == task_id
    wait_for(lambda: "completed" in page.locator("#timeline").inner_text(), 10,
             "the timeline's final state")
    steps = page.locator("#timeline li").all_inner_texts()
    assert "queued" in steps[0] and "submitted" in steps[0]
    assert any("assigned" in s and "web-ant" in s for s in steps)

    # An action without the token is refused, and changes nothing.
    page.locator("#foragers tr[data-name='web-ant-2'] button[data-op='drain']").click()
    wait_for(lambda: "refused" in page.locator("#action-result").inner_text(), 10,
             "the refusal")
    assert "401" in page.locator("#action-result").inner_text()
    page.wait_for_timeout(600)  # a snapshot later it is still active
    assert page.locator("#foragers tr[data-name='web-ant-2'] td").nth(1).inner_text() == "active"
    # With it, the forager drains (and leaves once idle).
    page.fill("#token", TOKEN)
    page.locator("#foragers tr[data-name='web-ant-2'] button[data-op='drain']").click()
    wait_for(lambda: "done" in page.locator("#action-result").inner_text(), 10,
             f"the drain: {page.locator('#action-result').inner_text()}")
    page.wait_for_selector("#foragers tr[data-name='web-ant-2']", state="detached",
                           timeout=15_000)


def test_read_token_asked_once_per_tab_and_no_buttons_when_read_only(
        procs: Procs, browser: Any) -> None:
    _, url = _colony(procs, "--http-read-token", "reader-secret")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(url)
    # Nothing of the colony without the token: the page asks for it.
    page.wait_for_selector("#login:not([hidden])")
    assert page.locator("#live").inner_text() == "token needed"
    assert page.locator("#foragers tr[data-name]").count() == 0
    page.fill("#login-token", "wrong")
    page.locator("#login-form button").click()
    wait_for(lambda: "refused" in page.locator("#login-result").inner_text(), 10,
             "the wrong token refused")
    page.fill("#login-token", "reader-secret")
    page.locator("#login-form button").click()
    page.wait_for_selector("#foragers tr[data-name='web-ant-1']")
    assert page.locator("#login").is_hidden() and page.locator("#live").inner_text() == "live"
    # Started without --http-token: read-only, so no drain, halt, cancel or retry button.
    assert "Read-only" in page.locator("#actions-state").inner_text()
    assert page.locator("button[data-op]").count() == 0
    assert page.locator("#token-label").is_hidden()
    # Kept for the tab: a reload does not ask again...
    page.reload()
    page.wait_for_selector("#foragers tr[data-name='web-ant-1']")
    assert page.locator("#login").is_hidden()
    # ...but another browser session (no shared tab storage) must give it again.
    other = browser.new_context().new_page()
    other.goto(url)
    other.wait_for_selector("#login:not([hidden])", timeout=15_000)
    other.close()
    context.close()
