"""An injected Thrift error through the fault engine, seen by Apache Thrift's own client:
the proxy answers getUser with an EXCEPTION message carrying TApplicationException
(INTERNAL_ERROR, type 6) in every framing and protocol the client speaks, in place of the
server's reply, and the next call goes through (tests/thrift_real.py's peer)."""

import pytest

from proxy.app import ProxyApp
from proxy.config import config_from_dict
from tests._support.faults import FaultSet, Rule
from tests.conftest import LoopThread
from tests.support import sample
from tests.thrift_real import MODES, ApacheServer, client, thrift_or_skip


@pytest.fixture(scope="module")
def gen():
    return thrift_or_skip()


@pytest.mark.parametrize("mode", MODES)
def test_apache_client_raises_the_injected_application_exception(gen, mode):
    from thrift.Thrift import TApplicationException
    srv = ApacheServer(gen).start()
    lt = LoopThread()
    config = config_from_dict({"routes": [{
        "name": "thrift", "protocol": "ttheader", "listen": "127.0.0.1:0",
        "upstream": "127.0.0.1:%d" % srv.port}]})
    fs = FaultSet([Rule("boom", "error", opcodes=["getUser"], trigger="once",
                        message="injected by frametap")], protocol="ttheader")
    config.routes[0].faults = fs
    app = ProxyApp(config)
    lt.run(app.start())
    try:
        c, _proto, trans = client(gen, app.routes[0].address[1], mode)
        try:
            with pytest.raises(TApplicationException) as info:
                c.getUser(7)
            assert info.value.type == TApplicationException.INTERNAL_ERROR == 6
            assert "injected by frametap" in str(info.value.message)
            assert c.getUser(8).name == "user-8"          # the connection carries on
        finally:
            trans.close()
        got = lt.call(lambda: sample(app, "frametap_responses_total", route="thrift",
                                     protocol="ttheader", opcode="getUser",
                                     status="INTERNAL_ERROR"))
        assert got == 1
    finally:
        lt.run(app.shutdown(0))
        lt.stop()
        srv.stop()
