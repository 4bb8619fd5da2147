"""The suite's own guards: an unexpected event-loop error fails a test, whichever way the
loop was run (tests/_support/loopcheck.py); the pure-Python tier is chosen by rule
(tests/conftest.py); the ready files name the ports the processes bound."""

import asyncio
import json
import sys
import threading

import pytest
import uvloop

from tests import conftest
from tests._support import loopcheck
from tests._support.processes import proxy_process, server_process
from tests.support import run


def _boom():
    raise RuntimeError("boom in a callback")


async def _callback_error():
    asyncio.get_running_loop().call_soon(_boom)
    await asyncio.sleep(0.05)


@pytest.fixture
def fresh():
    """A private collector for the duration of the test (the test's own stays clean)."""
    outer = loopcheck.current()
    inner = loopcheck.begin()
    try:
        yield inner
    finally:
        loopcheck._current = outer


def test_run_collects_a_callback_error(fresh):
    run(_callback_error())
    assert any("boom in a callback" in e for e in fresh.unexpected()), fresh.errors


def test_loop_thread_collects_a_callback_error(fresh):
    lt = conftest.LoopThread()
    try:
        lt.run(_callback_error())
    finally:
        lt.stop()
    assert any("boom in a callback" in e for e in fresh.unexpected()), fresh.errors


def test_a_loop_without_our_handler_is_caught_through_its_log(fresh):
    """asyncio.run / a reference server's own loop: the default handler logs it."""
    def in_thread():
        asyncio.run(_callback_error())
    t = threading.Thread(target=in_thread)
    t.start()
    t.join(10)
    uvloop.run(_callback_error())
    errors = [e for e in fresh.unexpected() if "boom in a callback" in e]
    assert len(errors) == 2, fresh.errors


def test_expected_errors_are_declared_by_pattern(fresh):
    fresh.expect(r"boom in a")
    run(_callback_error())
    assert fresh.errors and not fresh.unexpected()


@pytest.mark.loop_errors(r"boom in a callback")
def test_the_marker_declares_expected_errors():
    run(_callback_error())
    assert loopcheck.current().errors and not loopcheck.current().unexpected()


def test_unretrieved_task_exception_is_reported(fresh):
    async def fails():
        raise ValueError("nobody awaited me")

    async def main():
        asyncio.get_running_loop().create_task(fails())
        await asyncio.sleep(0.05)
    run(main())
    import gc
    gc.collect()
    assert any("nobody awaited me" in e for e in fresh.unexpected()), fresh.errors


def test_pure_python_tier_is_chosen_by_rule():
    import types
    mod = types.ModuleType("tests.test_new_parser_file")
    assert not conftest.tests_parser_twins(mod)
    from tests.parsers import impl_fixture
    mod.impl_fixture = impl_fixture
    assert conftest.tests_parser_twins(mod)
    mod2 = types.ModuleType("tests.test_other")
    from proxy import framing_py
    mod2.framing_py = framing_py
    assert conftest.tests_parser_twins(mod2)
    assert conftest.tests_parser_twins(sys.modules["tests.test_parser_flymq"]) \
        if "tests.test_parser_flymq" in sys.modules else True


@pytest.mark.slow
def test_ready_files_name_the_bound_ports(tmp_path):
    """frametap serve and frametap proxy on port 0: the ready files name what they bound,
    the addresses answer, and the files go away when the processes stop."""
    import urllib.request
    with server_process(tmp_path, "rocketmq") as srv:
        assert set(srv.ready["roles"]) == {"broker", "namesrv"}
        assert srv.ready["listen"] == [srv.role("broker"), srv.role("namesrv")]
        assert srv.ready["server"] == "rocketmq" and srv.ready["pid"] == srv.pid
        with proxy_process(tmp_path, config=f"""
[admin]
listen = "127.0.0.1:0"
[[routes]]
name = "ns"
protocol = "rocketmq"
listen = "127.0.0.1:0"
upstream = "{srv.role('namesrv')}"
[[routes]]
name = "broker"
protocol = "rocketmq"
listen = "127.0.0.1:0"
upstream = "{srv.role('broker')}"
""") as proxy:
            assert set(proxy.ready["routes"]) == {"ns", "broker"}
            assert all(not a.endswith(":0") for a in proxy.ready["routes"].values())
            with urllib.request.urlopen(proxy.admin_url + "/readyz", timeout=5) as r:
                assert r.status == 200
            from loadgen.rocketmq.client import RocketMQClient
            with RocketMQClient("127.0.0.1", proxy.port("ns")) as ns:
                assert ns.get_route("ready-file-topic").write_queues()
            ready_path = proxy.ready_path
            assert json.loads(ready_path.read_text()) == proxy.ready
        assert proxy.proc.returncode == 0, proxy.log_text()[-2000:]
        assert not ready_path.exists()
    assert not srv.ready_path.exists()


def test_a_raising_tracer_fails_the_call_and_is_kept_for_teardown():
    """Both twins re-raise a tracer's exception when feed() returns; checked_tracer also
    keeps it for teardown, so a test that happens to catch it still fails."""
    from tests.parsers import TRACER_ERRORS, checked_tracer, make, parser_impls
    from proxy.protocols.flymq.conformance import frame as fly_frame
    for impl in parser_impls("flymq").values():
        stats, parser = make(impl, "flymq")

        def picky(row):
            raise AssertionError("tracer check failed")
        parser.tracer = checked_tracer(picky)
        with pytest.raises(AssertionError, match="tracer check failed"):
            parser.feed(0, fly_frame(0x01, b"\x00" * 8))     # a request: one record
    assert len(TRACER_ERRORS) == len(parser_impls("flymq"))
    assert "tracer check failed" in TRACER_ERRORS[0]
    del TRACER_ERRORS[:]                 # expected here: do not fail this test
