"""A screenshot of TensorBoard on a sweep's event files (docs/tracking.md's figure).

    python scripts/screenshot_tensorboard.py LOGDIR OUT.png [--tag model_update] [--chromium /usr/bin/chromium]
        [--tensorboard .venv/bin/tensorboard]

Starts `tensorboard --logdir LOGDIR` on a free localhost port, opens its Time Series dashboard
in headless Chromium through Playwright (`pip install playwright`; it drives the Chromium given,
and downloads no browser), shows the scalar TAG's card alone with a log y-axis and no smoothing,
and saves the page. Neither package is a dependency of stabexp.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# Chromium on a machine with no network: nothing in the background may try to reach out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tensorboard(command: list, logdir: Path, port: int) -> subprocess.Popen:
    server = subprocess.Popen([*command, "--logdir", str(logdir), "--host", "127.0.0.1",
                               "--port", str(port), "--reload_interval", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=2).read()
            return server
        except OSError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit(f"tensorboard did not answer on port {port} within 60 s")


def shoot(url: str, tag: str, out: Path, chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 820})
        page.goto(url)
        page.wait_for_selector("input[placeholder*='Filter tags']", timeout=60_000)
        page.fill("input[placeholder*='Filter tags']", f"^{tag}$")
        page.wait_for_timeout(3000)
        # The points as logged: no smoothing, outliers in the y-range.
        smoothing = page.locator("input[type='number']").first
        smoothing.fill("0")
        smoothing.press("Enter")
        outliers = page.get_by_text("Ignore outliers in chart scaling")
        if outliers.count():
            outliers.first.click()
        page.get_by_role("button", name="Close side pane").first.click()
        page.get_by_role("button", name="More line chart options").first.click()
        page.get_by_role("menuitem", name="Toggle Y-axis log scale").first.click()
        page.get_by_role("button", name="Toggle full size mode").first.click()
        page.wait_for_timeout(3000)
        page.screenshot(path=str(out))
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--tag", default="model_update")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--tensorboard", help="the tensorboard command (default: this Python's tensorboard module)")
    args = parser.parse_args()
    port = free_port()
    command = [args.tensorboard] if args.tensorboard else [sys.executable, "-m", "tensorboard.main"]
    server = start_tensorboard(command, args.logdir, port)
    try:
        shoot(f"http://127.0.0.1:{port}/?darkMode=false#timeseries", args.tag, args.out, args.chromium)
    finally:
        server.kill()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
