"""The report's fault view (issue 22 item 5): frame-log rows a fault rule touched
(``attrs.fault``) and replies the proxy made itself (``attrs.injected = "1"``), counted per
route, opcode and fault, apart from the real answers.

A known frame log (written here with proxy.framelog.SCHEMA, as the proxy writes it: the
request a rule answered carries ``attrs.fault``, the injected reply ``attrs.injected`` and
no rule name) goes through the real Spark job; faults.csv, errors.csv and the page are
checked against numbers counted here, and the page is opened in headless Chromium.
"""

import csv
import os

import pytest

from tests.test_analyze import T0, proxy_pair, row, write_parquet

MS = 1_000_000


def fault_rows():
    """RocketMQ broker route 'broker': 40 SEND_MESSAGE_V2, every 10th answered SYSTEM_BUSY
    by the proxy (rule 'busy'); 3 real SYSTEM_BUSY answers from the broker; 20
    PULL_MESSAGE, 5 of them delayed by rule 'slow' and answered by the broker; 10
    HEART_BEAT nothing touched."""
    rows = []
    base = dict(route="broker", protocol="rocketmq", conn_id=1, peer="127.0.0.1:5000")
    for i in range(40):
        ts = T0 + i * 10 * MS
        if i % 10 == 0:                  # the proxy answered it: injected reply, no rule name
            rows.append(row(ts_ns=ts, source="proxy", run_id="r", direction="c2s", opcode=310,
                            opcode_name="SEND_MESSAGE_V2", kind="request",
                            correlation_id=str(i), frame_bytes=100, header_bytes=8,
                            payload_bytes=92, messages=1, attrs={"fault": "busy"}, **base))
            rows.append(row(ts_ns=ts + 50_000, source="proxy", run_id="r", direction="s2c",
                            opcode=310, opcode_name="SEND_MESSAGE_V2", kind="response",
                            correlation_id=str(i), status="SYSTEM_BUSY", outcome="error",
                            frame_bytes=60, header_bytes=8, payload_bytes=52, messages=0,
                            latency_ns=50_000, request_opcode_name="SEND_MESSAGE_V2",
                            attrs={"injected": "1"}, **base))
        elif i in (3, 13, 23):           # the broker's own SYSTEM_BUSY: a real error
            proxy_pair(rows, ts, "broker", "rocketmq", 1, "127.0.0.1:5000", "SEND_MESSAGE_V2",
                       str(i), 2 * MS, status="SYSTEM_BUSY", outcome="error", run_id="r")
        else:
            proxy_pair(rows, ts, "broker", "rocketmq", 1, "127.0.0.1:5000", "SEND_MESSAGE_V2",
                       str(i), 2 * MS, status="SUCCESS", run_id="r")
    for i in range(20):
        ts = T0 + i * 10 * MS + 5 * MS
        before = len(rows)
        proxy_pair(rows, ts, "broker", "rocketmq", 2, "127.0.0.1:5001", "PULL_MESSAGE",
                   str(1000 + i), (60 if i % 4 == 0 else 2) * MS, status="SUCCESS",
                   run_id="r")
        if i % 4 == 0:
            rows[before]["attrs"] = {"fault": "slow"}     # the delayed request's row
    for i in range(10):
        proxy_pair(rows, T0 + i * MS, "broker", "rocketmq", 3, "127.0.0.1:5002", "HEART_BEAT",
                   str(5000 + i), MS, status="SUCCESS", run_id="r")
    return rows


@pytest.fixture(scope="module")
def analysed(tmp_path_factory, java):
    from loadgen.analysis.job import analyze
    from loadgen.analysis.session import start_session, stop_session
    logs = tmp_path_factory.mktemp("fault-logs")
    rows = fault_rows()
    write_parquet(str(logs / "proxy-h-1-20261126T000000Z-0.parquet"), rows[:70])
    write_parquet(str(logs / "proxy-h-1-20261126T000000Z-1.parquet"), rows[70:])
    out = str(tmp_path_factory.mktemp("fault-out"))
    spark, owned = start_session("local[1]", [])
    try:
        result = analyze(spark, [str(logs)], out)
    finally:
        stop_session(spark, owned)
    return out, result


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_faults_csv_counts_touched_rows_and_injected_replies(analysed):
    out, _ = analysed
    got = read_csv(os.path.join(out, "faults.csv"))
    assert list(got[0]) == ["route", "protocol", "opcode", "fault", "status", "touched",
                            "injected", "injected_errors"]
    table = {(r["opcode"], r["fault"], r["status"]): (int(r["touched"]), int(r["injected"]),
                                                      int(r["injected_errors"]))
             for r in got}
    assert table == {
        ("PULL_MESSAGE", "slow", ""): (5, 0, 0),
        ("SEND_MESSAGE_V2", "busy", ""): (4, 0, 0),
        # the injected replies name no rule; one rule touched the opcode: it is 'busy'
        ("SEND_MESSAGE_V2", "busy", "SYSTEM_BUSY"): (0, 4, 4),
    }


def test_injected_replies_are_apart_from_the_real_answers(analysed):
    """The summary keeps the proxy's count (injected answers are answers, as in its
    metrics); the fault view and the errors section split them off."""
    from loadgen.analysis import report
    out, result = analysed
    send = next(r for r in result.summary if r["opcode"] == "SEND_MESSAGE_V2")
    assert (send["requests"], send["responses"], send["errors"]) == (40, 40, 7)
    view = report.View(result.tables)
    rows = {(r["opcode"], r["fault"]): r for r in report.fault_rows(view)}
    busy = rows[("SEND_MESSAGE_V2", "busy")]
    assert (busy["touched"], busy["injected"], busy["status"]) == (4, 4, "SYSTEM_BUSY ×4")
    assert (busy["real_answers"], busy["real_errors"]) == (36, 3)
    slow = rows[("PULL_MESSAGE", "slow")]
    assert (slow["touched"], slow["injected"], slow["real_answers"]) == (5, 0, 20)
    errors = {r["status"]: r["count"] for r in report.error_rows(view)
              if r["opcode"] == "SEND_MESSAGE_V2"}
    assert errors == {"SYSTEM_BUSY": 3, "SYSTEM_BUSY (injected: busy)": 4}
    # errors.csv (the contract) still counts every error answer by status
    errs = read_csv(os.path.join(out, "errors.csv"))
    assert [(r["opcode"], r["status"], r["errors"]) for r in errs] == [
        ("SEND_MESSAGE_V2", "SYSTEM_BUSY", "7")]


def test_fault_view_in_chromium(analysed, tmp_path):
    from tests.test_analyze_report import check_report_in_chromium
    out, _ = analysed
    page = os.path.join(out, "report.html")
    text = open(page).read()
    assert 'id="s-faults"' in text and "Injected faults" in text
    shot = check_report_in_chromium(page, tmp_path, expect_charts=[
        "opcode", "errors-by-status", "faults", "latency", "throughput", "p99", "errors"])
    assert os.path.getsize(shot) > 20_000


def test_a_run_without_faults_has_no_fault_section():
    from loadgen.analysis import report
    from tests.test_analyze_report import tables
    page = report.render(tables())
    assert 'id="s-faults"' not in page and 'href="#s-faults"' not in page


def test_the_terminal_names_each_fault(analysed):
    from loadgen.analysis.job import fault_lines
    _, result = analysed
    assert fault_lines(result.tables["faults"]) == [
        "fault slow: route broker PULL_MESSAGE: 5 rows touched",
        "fault busy: route broker SEND_MESSAGE_V2: 4 rows touched, injected replies: "
        "4 SYSTEM_BUSY"]
