"""Our results in Inspect's own viewer: an EvalResult written with write_inspect_log, bundled by
`inspect view bundle` into a static site, opened in headless Chromium (light and dark) from a
loopback server; the samples' inputs, targets, replies and scores are on the page, and the page
asks nothing of any other host."""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading

import pytest

from lab import chromium_page, keep_screenshot

pytestmark = pytest.mark.browser

ROWS = [("What is 47 plus 15?", "answer: 62", "answer: 62"), ("What is 9 minus 4?", "answer: 5", "9 - 4 = 5."),
        ("Compute 30 + 40.", "answer: 70", "answer: 70")]


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files, with the HTTP Range requests Inspect's viewer reads `.eval` zips by."""

    def log_message(self, *args):
        pass

    def send_head(self):
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
        path = self.translate_path(self.path)
        if not m or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        if m.group(1) == "":
            first, last = max(0, size - int(m.group(2))), size - 1
        else:
            first, last = int(m.group(1)), min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        fh = open(path, "rb")
        fh.seek(first)
        self.send_response(206)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(last - first + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self.range_left = last - first + 1
        return fh

    def copyfile(self, source, outputfile):
        left = getattr(self, "range_left", None)
        if left is None:
            return super().copyfile(source, outputfile)
        while left > 0:
            chunk = source.read(min(1 << 16, left))
            if not chunk:
                break
            outputfile.write(chunk)
            left -= len(chunk)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The bundled viewer site, served from loopback (made once: both colour schemes read it)."""
    import pandas as pd

    from machine_nb.evaluation.results import RESULT_COLUMNS, EvalResult

    rows = [{"row": i, "prompt": q, "expected": want, "match": "exact", "output": got, "correct": got == want,
             "format_ok": got.startswith("answer: "), "prompt_tokens": 15, "output_tokens": 5, "latency_s": 0.1,
             "stop_reason": "stop", "error": None} for i, (q, want, got) in enumerate(ROWS)]
    res = EvalResult(pd.DataFrame(rows, columns=RESULT_COLUMNS),
                     {"name": "arith_baseline", "model": "local/arith-tiny", "checkpoint": None, "engine": "local",
                      "parameters": {"max_tokens": 32, "temperature": 0.0, "seed": 0}})
    tmp_path = tmp_path_factory.mktemp("inspect")
    res.write_inspect_log(tmp_path / "logs" / "arith_baseline.eval")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INSPECT_")}
    done = subprocess.run([sys.executable, "-m", "inspect_ai", "view", "bundle", "--log-dir", str(tmp_path / "logs"),
                           "--output-dir", str(tmp_path / "site")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(RangeHandler, directory=str(tmp_path / "site")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_inspect_view_bundle_shows_our_samples(site, scheme, tmp_path):
    from playwright.sync_api import expect

    elsewhere = []

    def only_loopback(route):
        url = route.request.url
        if url.startswith(site) or url.startswith("data:") or url.startswith("blob:"):
            return route.continue_()
        elsewhere.append(url)
        return route.abort()

    with chromium_page() as page:
        page.emulate_media(color_scheme=scheme)
        page.route("**/*", only_loopback)
        page.goto(site)
        page.get_by_text("arith_baseline").first.click()
        try:
            for question, target, reply in ROWS:
                expect(page.get_by_text(question).first).to_be_visible()
                expect(page.get_by_text(reply, exact=True).first).to_be_visible()
            expect(page.get_by_text("3 Samples", exact=True)).to_be_visible()
            expect(page.get_by_text("tinker-sampling/local/arith-tiny").first).to_be_visible()
            body = page.inner_text("body")
            assert "answer: 5" in body and "ACCURACY" in body.upper()
        finally:
            keep_screenshot(page, tmp_path / f"inspect-view-{scheme}.png")
    assert elsewhere == [], elsewhere
