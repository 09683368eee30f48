"""Screenshots of VisualDL showing training runs, as in docs/monitoring.md.

    python examples/visualdl_screenshots.py outputs --out docs/images

Starts ``visualdl --logdir <logdir>`` on a free local port, opens it in headless Chromium (driven by Playwright,
which uses the installed browser and downloads nothing) and saves, into ``--out``:

    visualdl-scalars.png    the scalar charts, every group opened
    visualdl-hparams.png    the hyper-parameter table
    visualdl-parallel.png   the hyper-parameter parallel-coordinates view
    visualdl-samples.png    the sample-image grid

Needs Chromium (Debian: ``apt-get install chromium``; or ``--chromium PATH``) and ``pip install playwright``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Headless on a machine without a display, GPU or network: no sandbox (root in containers), no GPU, and none of the
# browser's own background connections (refused one by one on a closed network).
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync")
PAGES = ("scalars", "hparams", "parallel", "samples")


class ScreenshotError(RuntimeError):
    """Something the user can fix: no browser, no records, VisualDL did not start or render."""


def find_chromium(explicit: str | None = None) -> str | None:
    """The Chromium to drive: ``explicit``, else ``$CHROMIUM``, else the first of :data:`CHROMIUM_NAMES` on PATH."""
    for candidate in (explicit, os.environ.get("CHROMIUM"), *CHROMIUM_NAMES):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(url: str, server: subprocess.Popen, timeout: float) -> None:
    """Wait until VisualDL answers at ``url`` (its runs API), or fail with why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ScreenshotError(f"visualdl exited with code {server.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{url}/api/runs", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise ScreenshotError(f"visualdl did not answer at {url} within {timeout:.0f} s")


def capture(url: str, out_dir: Path, chromium: str, width: int, height: int, timeout: float) -> list[Path]:
    """Open VisualDL's pages at ``url`` and save one PNG per page of :data:`PAGES` into ``out_dir``."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / f"visualdl-{name}.png" for name in PAGES}
    ms = int(timeout * 1000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(ms)
            step = "the scalar charts"
            try:
                page.goto(f"{url}/scalar")
                page.wait_for_selector("canvas")  # a chart has been drawn
                # VisualDL opens only the first chart group: open the others (group headers are h3).
                for header in page.locator("h3").all()[1:]:
                    header.click()
                # One tall window rather than a full-page capture, which repeats VisualDL's fixed header mid-page.
                page.set_viewport_size({"width": width, "height": max(height, page.evaluate(
                    "document.documentElement.scrollHeight"))})
                page.mouse.move(0, 0)  # no chart highlighted under the pointer
                # Charts that were below the fold fetch their data only now; on a busy machine that takes seconds.
                # (VisualDL polls, so the network never goes idle: wait a fixed time.)
                page.wait_for_timeout(8000)
                page.screenshot(path=paths["scalars"])
                page.set_viewport_size({"width": width, "height": height})

                step = "the hyper-parameter table"
                page.goto(f"{url}/hyper-parameter")
                page.get_by_text("Trial ID").first.wait_for()
                page.wait_for_timeout(1000)
                page.screenshot(path=paths["hparams"])

                step = "the parallel-coordinates view (it hangs when a hyper-parameter name is wider than its axis)"
                page.get_by_text("Parallel Coordinates View").click()
                page.wait_for_selector("g.indicator")
                page.wait_for_timeout(1500)
                page.screenshot(path=paths["parallel"])

                step = "the sample images"
                page.goto(f"{url}/sample/image")
                page.wait_for_selector("img[src*='image']")
                page.wait_for_timeout(1000)
                page.screenshot(path=paths["samples"])
            except PlaywrightError as error:
                raise ScreenshotError(f"VisualDL did not show {step}: {str(error).splitlines()[0]}") from None
        finally:
            browser.close()
    return list(paths.values())


def take_screenshots(logdir: Path, out_dir: Path, chromium: str | None = None, width: int = 1280,
                     height: int = 900, timeout: float = 60.0) -> list[Path]:
    """Serve ``logdir`` with VisualDL on a free port, save the screenshots into ``out_dir``, stop the server."""
    browser = find_chromium(chromium)
    if browser is None:
        raise ScreenshotError(f"no Chromium found (looked for {', '.join(CHROMIUM_NAMES)}; give --chromium PATH)")
    if not any(logdir.rglob("vdlrecords.*")):
        raise ScreenshotError(f"{logdir} holds no VisualDL records (vdlrecords.* files); train a run first")
    port = free_port()
    url = f"http://127.0.0.1:{port}/app"
    with tempfile.TemporaryFile("w+") as server_log:
        server = subprocess.Popen(
            [sys.executable, "-m", "visualdl.server.app", "--logdir", str(logdir), "--host", "127.0.0.1",
             "--port", str(port)], stdout=server_log, stderr=subprocess.STDOUT)
        try:
            wait_until_serving(url, server, timeout)
            return capture(url, out_dir, browser, width, height, timeout)
        except ScreenshotError as error:
            server_log.seek(0)
            tail = server_log.read().strip().splitlines()[-5:]
            raise ScreenshotError(f"{error}{' (visualdl: ' + ' | '.join(tail) + ')' if tail else ''}") from None
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: python examples/visualdl_screenshots.py outputs --out docs/images")
    parser.add_argument("logdir", type=Path,
                        help="directory of VisualDL records (searched recursively), e.g. outputs")
    parser.add_argument("--out", type=Path, default=Path("docs/images"), help="where the PNGs go (docs/images)")
    parser.add_argument("--chromium", help="Chromium executable (default: $CHROMIUM or chromium on PATH)")
    parser.add_argument("--width", type=int, default=1280, help="browser window width in px (1280)")
    parser.add_argument("--height", type=int, default=900, help="browser window height in px (900)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each step (60)")
    args = parser.parse_args(argv)
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("error: Playwright is not installed: pip install playwright (it drives the installed Chromium)",
              file=sys.stderr)
        return 2
    try:
        paths = take_screenshots(args.logdir, args.out, args.chromium, args.width, args.height, args.timeout)
    except ScreenshotError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
