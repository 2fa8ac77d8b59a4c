"""Refresh docs/dashboard.png: a busy colony (six foragers, a stream of tasks of varied
length, some failing, a few memory keys) photographed in headless Chromium.

    python -m tests.dashboard_shot [docs/dashboard.png]
"""

from __future__ import annotations

import random
import shutil
import sys
import threading
import time

from playwright.sync_api import sync_playwright

from meshant import Client
from meshant.apps import _procs


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png"
    chromium = shutil.which("chromium")
    assert chromium, "apt-get install chromium"
    procs = []
    stop = threading.Event()
    t: threading.Thread | None = None
    try:
        q = _procs.spawn(["queen", "--bind", "tcp://127.0.0.1:0", "--pub", "tcp://127.0.0.1:0",
                          "--json", "--http", "127.0.0.1:0", "--name", "hive",
                          "--http-token", "shot-token",
                          "--journal", ":memory:"])
        procs.append(q)
        info = _procs.read_json_line(q, 20)
        ep = info["router"]
        for i, (zone, slots) in enumerate([("gpu", 4), ("gpu", 4), ("cpu", 2), ("cpu", 2),
                                           ("cpu", 2), ("edge", 1)]):
            f = _procs.spawn(["forager", "--queen", ep, "--json", "--name",
                              f"{zone}-ant-{i + 1}", "--slots", str(slots),
                              "--label", f"zone={zone}"])
            procs.append(f)
            _procs.read_json_line(f, 20)

        def work() -> None:
            rng = random.Random(7)
            with Client(ep, queen_wait=5) as c:
                c.memory.set("config/rate", {"per_s": 40})
                c.memory.set("crawl/frontier", ["a", "b"])
                c.memory.set("model/version", "2026-11")
                futs = []
                while not stop.is_set():
                    if rng.random() < 0.015:  # not waited for: its breaker may hold it
                        c.submit("fail", {"message": "upstream 503"}, max_attempts=1)
                    else:
                        futs.append(c.submit("sleep", {"seconds": rng.choice(
                            [0.05, 0.1, 0.2, 0.4, 1.0])}))
                    if len(futs) > 30:
                        for fu in futs[:10]:
                            try:
                                fu.exception(60)
                            except TimeoutError:
                                pass
                        futs = futs[10:]
                    time.sleep(0.01)

        t = threading.Thread(target=work, daemon=True)
        t.start()
        time.sleep(12)
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=chromium, headless=True,
                                   args=["--no-sandbox", "--disable-gpu"])
            page = b.new_page(viewport={"width": 1400, "height": 1200})
            page.goto(info["http"])
            page.wait_for_selector("#foragers tr[data-name]")
            time.sleep(20)  # chart points
            page.locator("#recent tr[data-task]").first.click()
            page.wait_for_selector("#task-detail:not([hidden])")
            page.screenshot(path=out, full_page=True)
            b.close()
    finally:
        stop.set()
        if t is not None:
            t.join(60)  # its client closes before the colony goes
        _procs.stop(procs)
    print(out)


if __name__ == "__main__":
    main()
