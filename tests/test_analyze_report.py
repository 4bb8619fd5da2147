"""report.html in a real browser: headless Chromium driven over the DevTools protocol.

``check_report_in_chromium`` opens a report from file://, records console errors,
uncaught exceptions and every network request, waits for plotly to draw, checks that
each chart the page lists (its ``frametap-meta`` JSON) has an SVG with traces holding
data, and writes a full-page screenshot.  test_analyze.py runs it on the report of the
known run; the tests here render pages from small tables directly (no Spark), for the
cases a run rarely produces: no client logs, no records at all.

Chromium is Debian's ``chromium`` (/usr/bin/chromium); without it these tests skip, or
fail when FRAMETAP_CI is set (.ci/run installs it).
"""

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest

from loadgen.analysis import report

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-extensions",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
                  "--remote-debugging-port=0", "--remote-allow-origins=*",
                  "--window-size=1400,1000"]

#: what the page reports about each plotly chart once drawn
CHART_PROBE = """
(() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => ({
    id: gd.id,
    traces: (gd.data || []).length,
    points: (gd.data || []).reduce((n, t) => n + ((t.x || []).filter(v => v !== null).length), 0),
    svgs: gd.querySelectorAll('svg.main-svg').length,
    drawn: gd.querySelectorAll('g.trace').length,
    marks: gd.querySelectorAll('g.point path, path.js-line').length,
    modebar: gd.querySelectorAll('.modebar').length,
    hover: gd._fullLayout ? gd._fullLayout.hovermode : null,
})))()
"""


def chromium_path():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def need_chromium():
    path = chromium_path()
    if path is None:
        reason = "no chromium (apt-get install chromium)"
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(reason + " (FRAMETAP_CI is set: CI must have it)")
        pytest.skip(reason)
    return path


class Chromium:
    """One headless Chromium (its own profile under ``workdir``) and a DevTools
    connection to its page.  ``close()`` ends its whole process group."""

    def __init__(self, workdir):
        import websocket
        self.profile = os.path.join(workdir, "chromium-profile")
        os.makedirs(self.profile, exist_ok=True)
        try:                          # a stale one from an earlier browser names a dead port
            os.unlink(os.path.join(self.profile, "DevToolsActivePort"))
        except FileNotFoundError:
            pass
        self.log = open(os.path.join(workdir, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            [need_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.events = []
        self._id = 0
        try:
            port = self._port()
            pages = []
            deadline = time.monotonic() + 30
            while not pages:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                                timeout=5) as r:
                        pages = [t for t in json.load(r) if t.get("type") == "page"]
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                if not pages:
                    time.sleep(0.1)
            self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60,
                                                  suppress_origin=True)
        except BaseException:
            self.close()
            raise

    def _port(self):
        marker = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}; see "
                                   f"{self.log.name}")
            try:
                with open(marker) as f:
                    first = f.readline().strip()
                if first:
                    return int(first)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port in 30 s")

    def call(self, method, **params):
        """Send a command; events that arrive meanwhile are kept in ``events``."""
        self._id += 1
        ident = self._id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == ident:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e["method"] == method for e in self.events):
                return
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                msg = json.loads(self.ws.recv())
            finally:
                self.ws.settimeout(60)
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"no {method} in {timeout} s")

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                ws.close()
            except Exception:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()


def problems(events):
    """Console errors, uncaught exceptions and log errors among DevTools ``events``."""
    out = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(p.get("exceptionDetails"))[:500])
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + json.dumps(p.get("args"))[:500])
        elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + p["entry"].get("text", "")[:500])
    return out


def check_report_in_chromium(page, workdir, expect_charts):
    """Open ``page`` and check it (see the module docstring); returns the screenshot's
    path (also copied into $FRAMETAP_ARTIFACTS when that is set)."""
    browser = Chromium(str(workdir))
    try:
        for domain in ("Runtime", "Log", "Page", "Network"):
            browser.call(f"{domain}.enable")
        browser.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                     deviceScaleFactor=1, mobile=False)
        browser.call("Page.navigate", url="file://" + os.path.abspath(page))
        browser.wait_for("Page.loadEventFired", timeout=60)
        listed = browser.evaluate(
            "JSON.parse(document.getElementById('frametap-meta').textContent).charts")
        assert listed == expect_charts
        charts, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:       # plotly draws after load: wait for it
            charts = browser.evaluate(CHART_PROBE)
            if len(charts) == len(listed) and all(c["marks"] for c in charts):
                break
            time.sleep(0.2)
        assert [c["id"] for c in charts] == listed
        for c in charts:
            assert c["traces"] >= 1 and c["points"] >= 1, c
            assert c["svgs"] >= 1 and c["drawn"] >= 1 and c["marks"] >= 1, c
            assert c["modebar"] == 1 and c["hover"], c        # zoom/pan bar, hover labels
        # hovering a chart shows its label: the page is interactive
        if listed:
            browser.evaluate(
                f"Plotly.Fx.hover('{listed[0]}', [{{curveNumber: 0, pointNumber: 0}}])")
            hovers = (f"document.getElementById('{listed[0]}')"
                      ".querySelectorAll('.hovertext').length")
            assert browser.evaluate(hovers) >= 1
            browser.evaluate(f"Plotly.Fx.unhover('{listed[0]}')")
        requests = [e["params"]["request"]["url"] for e in browser.events
                    if e["method"] == "Network.requestWillBeSent"]
        assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in requests), requests
        assert problems(browser.events) == []
        height = browser.evaluate("document.documentElement.scrollHeight")
        shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                            clip={"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1})
        path = os.path.join(str(workdir), "report.png")
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        artifacts = os.environ.get("FRAMETAP_ARTIFACTS")
        if artifacts:
            os.makedirs(artifacts, exist_ok=True)
            shutil.copy(path, os.path.join(artifacts, os.path.basename(os.path.dirname(page))
                                           + "-report.png"))
        return path
    finally:
        browser.close()


# ---- pages rendered from small tables (no Spark) ------------------------------------------

T0 = 1_795_030_400_000_000_000


def tables(with_client=False, empty=False):
    """Small tables in the shape loadgen.analysis.job collects."""
    summary, series, slowest, decomposition, runs = [], [], [], [], []
    if not empty:
        for i, op in enumerate(("PRODUCE", "FETCH")):
            summary.append(dict(source="proxy", route="fly", protocol="flymq", opcode=op,
                                requests=100, responses=99, errors=2, error_ratio=0.0202,
                                timeouts=1 - i, unmatched=i, rate_per_s=10.0, p50_ms=1.0 + i,
                                p90_ms=2.0 + i, p99_ms=3.0 + i, p999_ms=4.0 + i, max_ms=5.0 + i,
                                frame_bytes=1000, messages=100))
        for s in range(10):
            series.append(dict(bucket_s=T0 // 10**9 + s, source="proxy", route="fly",
                               requests=20, responses=20, errors=s % 3, p99_ms=3.0 + s / 10))
        slowest.append(dict(ts_ns=T0 + 5, source="proxy", route="fly", protocol="flymq",
                            opcode="FETCH", conn_id=1, peer="127.0.0.1:5000",
                            correlation_id="7", latency_ms=6.0, status="OK"))
        runs.append(dict(run_id="r1", source="proxy", records=400, first_ns=T0,
                         last_ns=T0 + 9 * 10**9))
    if with_client:
        decomposition.append(dict(route="fly", protocol="flymq", opcode="PRODUCE", pairs=50,
                                  client_p50_ms=1.5, client_p99_ms=3.5, server_p50_ms=1.0,
                                  server_p99_ms=3.0, outside_p50_ms=0.5, outside_p99_ms=0.6))
    meta = dict(paths=["/logs"], files=1, records=sum(r["records"] for r in runs), runs=runs,
                sources=sorted({r["source"] for r in runs}),
                first_ns=runs[0]["first_ns"] if runs else None,
                last_ns=runs[0]["last_ns"] if runs else None, accuracy=10000,
                generated="2026-11-23T10:00:00Z")
    return dict(meta=meta, summary=summary, series=series, bucket_s=1, slowest=slowest,
                decomposition=decomposition)


def test_page_is_self_contained():
    page = report.render(tables(with_client=True))
    assert page.count("<script") == page.count("</script>")
    assert page.count("Plotly.newPlot") == 6
    js = report.plotly.offline.get_plotlyjs()
    assert page.count(js) == 1                   # plotly.js once, not per chart
    rest = page.replace(js, "")
    assert "cdn." not in rest and "src=\"http" not in rest and "href=\"http" not in rest
    assert "<script src" not in rest


def test_page_without_client_logs_in_chromium(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(report.render(tables()))
    text = path.read_text()
    assert "there is no decomposition" in text
    check_report_in_chromium(str(path), tmp_path,
                             expect_charts=["latency", "throughput", "p99", "errors", "problems"])


def test_page_without_records_in_chromium(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(report.render(tables(empty=True)))
    assert "No answered requests" in path.read_text()
    check_report_in_chromium(str(path), tmp_path, expect_charts=[])
