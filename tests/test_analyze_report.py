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
    marks: gd.querySelectorAll('g.point path, path.js-line, path.point').length,
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


def _leg(source, protocol, opcode, leg="c2s", requests=100, responses=99, errors=0,
         timeouts=0, cut_off=0, p50=1.0, p99=3.0):
    return dict(source=source, protocol=protocol, opcode=opcode, leg=leg, requests=requests,
                responses=responses, errors=errors, timeouts=timeouts, cut_off=cut_off,
                p50_ms=p50, p99_ms=p99)


def tables(with_client=False, empty=False, with_runs=False):
    """Small tables in the shape loadgen.analysis.job collects."""
    summary, series, slowest, decomposition, runs = [], [], [], [], []
    legs, errors, totals, op_series, run_files = [], [], [], [], []
    if not empty:
        for i, op in enumerate(("PRODUCE", "FETCH")):
            summary.append(dict(source="proxy", route="fly", protocol="flymq", opcode=op,
                                requests=100, responses=99, errors=2, error_ratio=0.0202,
                                timeouts=1 - i, unmatched=i, rate_per_s=10.0, p50_ms=1.0 + i,
                                p90_ms=2.0 + i, p99_ms=3.0 + i, p999_ms=4.0 + i, max_ms=5.0 + i,
                                frame_bytes=1000, messages=100, cut_off=i * 3))
            legs.append(_leg("proxy", "flymq", op, errors=2, timeouts=1 - i, cut_off=i * 3,
                             p50=1.0 + i, p99=3.0 + i))
            errors.append(dict(source="proxy", route="fly", protocol="flymq", opcode=op,
                               status="ERROR", errors=2))
            for s in range(10):
                op_series.append(dict(bucket_s=T0 // 10**9 + s, source="proxy",
                                      protocol="flymq", opcode=op, leg="c2s", requests=10,
                                      responses=10, errors=s % 2, timeouts=0,
                                      cut_off=3 if (i and s == 9) else 0, p50_ms=1.0 + i,
                                      p99_ms=3.0 + i + s / 10))
        for s in range(10):
            series.append(dict(bucket_s=T0 // 10**9 + s, source="proxy", route="fly",
                               protocol="flymq", requests=20, responses=20, errors=s % 3,
                               timeouts=0, cut_off=0, p99_ms=3.0 + s / 10))
        slowest.append(dict(ts_ns=T0 + 5, source="proxy", route="fly", protocol="flymq",
                            opcode="FETCH", conn_id=1, peer="127.0.0.1:5000",
                            correlation_id="7", latency_ms=6.0, status="OK"))
        runs.append(dict(run_id="r1", source="proxy", records=400, first_ns=T0,
                         last_ns=T0 + 9 * 10**9))
        totals += [dict(source="proxy", protocol=p, leg="c2s", requests=200, responses=198,
                        errors=4, timeouts=1, cut_off=3, unmatched=1, first_req_ns=T0,
                        last_req_ns=T0 + 9 * 10**9, p50_ms=1.5, p90_ms=2.5, p99_ms=3.5,
                        max_ms=6.0) for p in (None, "flymq")]
    if with_client:
        decomposition.append(dict(route="fly", protocol="flymq", opcode="PRODUCE", pairs=50,
                                  client_p50_ms=1.5, client_p99_ms=3.5, server_p50_ms=1.0,
                                  server_p99_ms=3.0, outside_p50_ms=0.5, outside_p99_ms=0.6))
        legs.append(_leg("client", "flymq", "PRODUCE", p50=1.5, p99=3.5))
        for s in range(10):
            op_series.append(dict(bucket_s=T0 // 10**9 + s, source="client", protocol="flymq",
                                  opcode="PRODUCE", leg="c2s", requests=10, responses=10,
                                  errors=0, timeouts=0, cut_off=0, p50_ms=1.5, p99_ms=3.5))
        totals += [dict(source="client", protocol=p, leg="c2s", requests=100, responses=99,
                        errors=0, timeouts=0, cut_off=0, unmatched=0, first_req_ns=T0,
                        last_req_ns=T0 + 9 * 10**9, p50_ms=1.5, p90_ms=2.5, p99_ms=3.5,
                        max_ms=6.0) for p in (None, "flymq")]
    if with_runs:
        # a fleximq REQ that crosses the proxy twice, a Thrift method that fails on purpose
        legs += [_leg("proxy", "fleximq", "REQ", requests=1548, responses=1544, timeouts=4),
                 _leg("proxy", "fleximq", "REQ", "s2c", requests=1548, responses=1548),
                 _leg("client", "fleximq", "REQ", requests=1546, responses=1544, timeouts=2),
                 _leg("proxy", "ttheader", "retired", requests=162, responses=162, errors=162),
                 _leg("client", "ttheader", "retired", requests=162, responses=162,
                      errors=162)]
        errors += [dict(source=side, route="ttheader", protocol="ttheader", opcode="retired",
                        status="UNKNOWN_METHOD", errors=162) for side in ("proxy", "client")]
        run_files += [
            {"source": "demo", "demo": {"seconds": 20, "users": 8, "service_time": "1ms",
                                        "expected_failures": [
                                            {"protocol": "ttheader", "opcode": "retired",
                                             "status": "UNKNOWN_METHOD",
                                             "why": "a method the service does not have"}]}},
            {"source": "client", "locust": {
                "users": 8, "spawn_rate": 8, "run_time_s": 20, "host": "127.0.0.1:7001",
                "protocols": ["fleximq"], "user_classes": ["FlexiMQRequester"],
                "stats": [{"type": "fleximq", "name": "REQ", "requests": 1546,
                           "failures": 2, "p50_ms": 3, "p99_ms": 15}],
                "errors": [{"type": "fleximq", "name": "REQ", "occurrences": 2,
                            "error": "TimeoutError('fleximq: no answer in 10.0s')"}]}},
            {"source": "proxy", "proxy": {"routes": [
                {"name": "flex", "protocol": "fleximq", "listen": "127.0.0.1:7001",
                 "upstream": "127.0.0.1:7890", "request_timeout": 30.0}]}}]
    meta = dict(paths=["/logs"], files=1, records=sum(r["records"] for r in runs), runs=runs,
                sources=sorted({r["source"] for r in runs}),
                first_ns=runs[0]["first_ns"] if runs else None,
                last_ns=runs[0]["last_ns"] if runs else None, accuracy=10000,
                generated="2026-11-23T10:00:00Z", run_files=len(run_files))
    return dict(meta=meta, summary=summary, series=series, bucket_s=1, slowest=slowest,
                decomposition=decomposition, legs=legs, errors=errors, totals=totals,
                op_series=op_series, op_bucket_s=1, runs=run_files)


def test_page_is_self_contained():
    page = report.render(tables(with_client=True, with_runs=True))
    assert page.count("<script") == page.count("</script>")
    js = report.plotly.offline.get_plotlyjs()
    assert page.count(js) == 1                   # plotly.js once, not per chart
    rest = page.replace(js, "")
    assert "cdn." not in rest and "src=\"http" not in rest and "href=\"http" not in rest
    assert "<script src" not in rest


def test_old_tables_still_render():
    """A page from the tables an older job collected (no legs, totals, run files...)."""
    data = tables(with_client=True)
    for key in ("legs", "errors", "totals", "op_series", "op_bucket_s", "runs"):
        del data[key]
    page = report.render(data)
    assert "No requests in these frame logs." in page        # the per-opcode chart


def test_headline_quotes_the_numbers():
    page = report.render(tables(with_client=True, with_runs=True))
    for text in ("Clients (Locust users", "Proxy (requests clients sent", "200",
                 "errors (of answers)", "2.02 %", "cut off at close", "3.50 ms",
                 "8 users, spawn rate 8/s, run time 20 s, host 127.0.0.1:7001",
                 "frametap demo: 8 users per protocol for 20 s", "<h3>Proxy routes</h3>",
                 "<td>flex</td>"):
        assert text in page, text


def test_comparison_explains_the_differences():
    page = report.render(tables(with_client=True, with_runs=True))
    assert ("each REQ crosses the proxy twice - from the requester (c2s: 1,548) and on to "
            "the peer that answers (s2c: 1,548); Locust counts it once: compare with c2s"
            in page)
    assert "Locust&#x27;s own count" in page
    assert "TimeoutError(&#x27;fleximq: no answer in 10.0s&#x27;)" in page


def test_errors_by_status_mark_the_expected_ones():
    page = report.render(tables(with_client=True, with_runs=True))
    assert page.count("<tr class=expected>") == 2           # the proxy's row and the client's
    assert "expected: a method the service does not have" in page
    assert "cut off (connection closed first)" in page        # FETCH's cut-offs, apart
    assert "timeout (no answer in time)" in page


@pytest.mark.slow
def test_page_without_client_logs_in_chromium(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(report.render(tables()))
    text = path.read_text()
    assert "there is no decomposition" in text
    check_report_in_chromium(str(path), tmp_path,
                             expect_charts=["opcode", "errors-by-status", "latency",
                                            "throughput", "p99", "errors", "problems"])


@pytest.mark.slow
def test_page_without_records_in_chromium(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(report.render(tables(empty=True)))
    assert "No answered requests" in path.read_text()
    check_report_in_chromium(str(path), tmp_path, expect_charts=[])


@pytest.mark.slow
def test_selectors_redraw_their_charts_in_chromium(tmp_path):
    """Picking another opcode (or protocol) redraws that chart with its own data."""
    path = tmp_path / "report.html"
    path.write_text(report.render(tables(with_client=True, with_runs=True)))
    browser = Chromium(str(tmp_path))
    try:
        for domain in ("Runtime", "Log", "Page"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", url="file://" + str(path))
        browser.wait_for("Page.loadEventFired", timeout=60)
        title = ("document.getElementById('opcode')._fullLayout.title.text")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not browser.evaluate(
                "!!(document.getElementById('opcode')._fullLayout)"):
            time.sleep(0.2)
        options = browser.evaluate(
            "[...document.getElementById('opcode-pick').options].map(o => o.value)")
        # the opcodes with a series, busiest first (the others have no rows over time)
        assert options == ["flymq · FETCH", "flymq · PRODUCE"]
        assert browser.evaluate(title).startswith("flymq · FETCH: ")
        names = browser.evaluate("document.getElementById('opcode').data"
                                ".map(t => t.legendgroup + ' ' + t.name)")
        assert "proxy p99" in names and "proxy cut off/s" in names
        browser.evaluate("(() => { const s = document.getElementById('opcode-pick'); "
                         "s.value = 'flymq · PRODUCE'; s.dispatchEvent(new Event('change')); "
                         "})()")
        assert browser.evaluate(title).startswith("flymq · PRODUCE: ")
        names = browser.evaluate("document.getElementById('opcode').data"
                                ".map(t => t.legendgroup + ' ' + t.name)")
        assert "client p50" in names and "proxy cut off/s" not in names
        browser.evaluate("(() => { const s = document.getElementById('latency-pick'); "
                         "s.value = 'flymq'; s.dispatchEvent(new Event('change')); })()")
        labels = browser.evaluate("document.getElementById('latency').data[0].y")
        assert labels == ["fly FETCH", "fly PRODUCE"]
        assert problems(browser.events) == []
    finally:
        browser.close()
