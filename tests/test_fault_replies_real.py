"""Real clients reading the injected error replies (proxy/protocols/<pkg>/faults.py, issue
22) as they would read a real server's: Apache Thrift's Python client (THeader binary,
compact, zlib; framed binary/compact; unframed binary), rstream (and rbfly's decoder)
against the reference Stream broker, and the loadgen/ clients for Thrift (Kitex TTHeader,
THeader with zlib, framed), RocketMQ, FlyMQ and fleximq against their reference servers.

Between client and server sits a small injecting relay (real sockets on 127.0.0.1, port
0): it splits the client's bytes into frames and answers the frames a test picks with
``error_reply`` instead of forwarding them; everything else passes both ways untouched,
so the calls before and after an injected error show the connection stays usable.
"""

import asyncio
import importlib.metadata
import struct

import pytest

from proxy.protocols.fleximq import faults as fleximq_faults
from proxy.protocols.flymq import faults as flymq_faults
from proxy.protocols.rabbitmq_stream import faults as stream_faults
from proxy.protocols.rocketmq import faults as rocketmq_faults
from proxy.protocols.ttheader import faults as tt_faults
from tests.conftest import LoopThread


class InjectingRelay:
    """Relay 127.0.0.1:0 -> upstream; ``frame_len(buf)`` returns the first c2s frame's
    length (None: not known yet); ``inject(frame)`` returns None to forward the frame or
    the bytes to answer it with (the frame is then not forwarded)."""

    def __init__(self, lt, upstream_port, frame_len, inject):
        self.lt = lt
        self.upstream_port = upstream_port
        self.frame_len = frame_len
        self.inject = inject
        self.injected = []                     # (request, reply)
        self.server = lt.run(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]

    async def _client(self, reader, writer):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        back = asyncio.ensure_future(self._s2c(ur, writer))
        buf = bytearray()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                buf += data
                while True:
                    n = self.frame_len(buf)
                    if n is None or len(buf) < n:
                        break
                    frame = bytes(buf[:n])
                    del buf[:n]
                    reply = self.inject(frame)
                    if reply is None:
                        uw.write(frame)
                    else:
                        self.injected.append((frame, reply))
                        writer.write(reply)
                await uw.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            uw.close()
            try:
                await asyncio.wait_for(back, 5)
            except (asyncio.TimeoutError, ConnectionError, OSError):
                back.cancel()
            writer.close()

    async def _s2c(self, ur, writer):
        try:
            while True:
                data = await ur.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    def close(self):
        async def _close():
            self.server.close()
            await self.server.wait_closed()
        self.lt.run(_close())


@pytest.fixture
def lt():
    loop = LoopThread()
    yield loop
    loop.stop()


def _u32_len(extra):
    def frame_len(buf):
        return 4 + struct.unpack_from(">I", buf)[0] + extra if len(buf) >= 4 else None
    return frame_len


# --------------------------------------------------------------------------- Thrift

def _thrift_frame_len(buf):
    """Framed/header: the length word; unframed binary: walked with Apache's own
    TBinaryProtocol over the bytes so far (None until the message is whole)."""
    if len(buf) < 4:
        return None
    if buf[0] == 0x80 and buf[1] == 0x01:
        from thrift.protocol.TBinaryProtocol import TBinaryProtocol
        from thrift.Thrift import TType
        from thrift.transport.TTransport import TMemoryBuffer
        mem = TMemoryBuffer(bytes(buf))
        proto = TBinaryProtocol(mem)
        try:
            proto.readMessageBegin()
            proto.skip(TType.STRUCT)
            proto.readMessageEnd()
        except Exception:                    # EOF: the message is not whole yet
            return None
        return mem._buffer.tell()
    return 4 + struct.unpack_from(">I", buf)[0]


@pytest.fixture(scope="module")
def gen():
    from tests.thrift_real import thrift_or_skip
    return thrift_or_skip()


@pytest.mark.parametrize("mode", ["header-binary", "header-compact", "header-zlib",
                                  "framed-binary", "framed-compact", "unframed-binary"])
def test_apache_thrift_client_raises_the_injected_application_exception(gen, lt, mode):
    from thrift.Thrift import TApplicationException
    from tests.thrift_real import ApacheServer, client
    server = ApacheServer(gen).start()
    statuses = {"getUser": tt_faults.error_status("INTERNAL_ERROR"),
                "listUsers": tt_faults.error_status("PROTOCOL_ERROR")}

    def inject(frame):
        call = tt_faults._call(frame)
        status = statuses.get(call.name.decode())
        if status is None:
            return None
        return tt_faults.error_reply(frame, *status, f"injected into {call.name.decode()}")

    relay = InjectingRelay(lt, server.port, _thrift_frame_len, inject)
    try:
        c, _proto, trans = client(gen, relay.port, mode)
        try:
            assert c.echo("before") == "before"
            with pytest.raises(TApplicationException) as e:
                c.getUser(1)
            assert e.value.type == TApplicationException.INTERNAL_ERROR == 6
            assert e.value.message == "injected into getUser"
            c.log("a oneway call is forwarded")
            with pytest.raises(TApplicationException) as e:
                c.listUsers(2, {})
            assert (e.value.type, e.value.message) == (7, "injected into listUsers")
            assert c.echo("after") == "after"          # the connection is still in step
        finally:
            trans.close()
        assert len(relay.injected) == 2
    finally:
        relay.close()
        server.stop()


@pytest.mark.parametrize("transport,protocol", [("ttheader", "binary"), ("ttheader", "compact"),
                                                ("theader", "binary"), ("framed", "compact")])
def test_loadgen_thrift_client_over_kitex_ttheader_sees_the_injected_exception(
        lt, transport, protocol):
    from loadgen.ttheader.client import TApplicationException, ThriftClient
    from loadgen.ttheader.server import ThriftServerThread
    code, label = tt_faults.error_status("UNKNOWN_METHOD")

    def inject(frame):
        if tt_faults._call(frame).name == b"getUser":
            return tt_faults.error_reply(frame, code, label, "getUser is switched off")
        return None

    with ThriftServerThread() as srv:
        relay = InjectingRelay(lt, srv.port, _u32_len(0), inject)
        try:
            c = ThriftClient("127.0.0.1", relay.port, transport, protocol,
                             zlib=transport == "theader")
            try:
                assert c.call("echo", "x") == "x"
                with pytest.raises(TApplicationException) as e:
                    c.call("getUser", 42)            # the client checks name and seq id
                assert (e.value.type, e.value.message) == (1, "getUser is switched off")
                assert c.last_status == "UNKNOWN_METHOD"
                assert c.call("echo", "y") == "y"
            finally:
                c.close()
        finally:
            relay.close()
    assert len(relay.injected) == 1


# --------------------------------------------------------------------------- Stream

@pytest.mark.slow
def test_rstream_sees_the_injected_codes(lt):
    pytest.importorskip("rstream")
    from rstream import AMQPMessage, Producer, exceptions
    from loadgen.rabbitmq_stream.server import StreamBrokerThread
    from proxy.protocols.rabbitmq_stream import constants as K
    code, label = stream_faults.error_status("STREAM_NOT_AVAILABLE")

    def inject(frame):
        key = struct.unpack_from(">H", frame, 4)[0]
        if key == K.PUBLISH or (key == K.CREATE and b"refused" in frame):
            return stream_faults.error_reply(frame, code, label, "")
        return None

    with StreamBrokerThread(users={"guest": "guest"}) as broker:
        relay = InjectingRelay(lt, broker.port, _u32_len(0), inject)
        # the broker's Metadata must name the relay, or rstream publishes around it
        broker.broker.advertised_host, broker.broker.advertised_port = "127.0.0.1", relay.port

        async def scenario():
            seen = []
            done = asyncio.Event()

            def on_confirm(status):
                seen.append(status)
                if len(seen) == 3:
                    done.set()

            async with Producer("127.0.0.1", relay.port, username="guest",
                                password="guest") as p:
                with pytest.raises(exceptions.StreamNotAvailable):
                    await p.create_stream("refused")
                await p.create_stream("orders")
                await p.send_batch("orders", [AMQPMessage(body=b"m%d" % i) for i in range(3)],
                                   on_publish_confirm=on_confirm)
                await asyncio.wait_for(done.wait(), 10)
                try:
                    await p.send_wait("orders", AMQPMessage(body=b"w"), timeout=2)
                    wait = "returned"
                except exceptions.StreamNotAvailable:
                    wait = "raised"
                except asyncio.TimeoutError:
                    wait = "timed out"
            return seen, wait

        try:
            seen, wait = lt.run(scenario(), timeout=60)
        finally:
            relay.close()
    assert [(s.is_confirmed, s.response_code) for s in seen] == [(False, 6)] * 3
    assert sorted(s.message_id for s in seen) == [1, 2, 3]
    # rstream 1.1.1's _on_publish_error never removes the id a send_wait future waits
    # for, so the future is never failed: send_wait times out instead of raising
    # StreamNotAvailable (the callback above gets the code).  Anything but a success.
    assert wait in ("raised", "timed out")
    if importlib.metadata.version("rstream") != "1.1.1":
        assert wait == "raised"                       # a fixed rstream raises
    publish_errors = [reply for frame, reply in relay.injected
                      if struct.unpack_from(">H", frame, 4)[0] == K.PUBLISH]
    assert publish_errors
    rbfly_codec = pytest.importorskip("rbfly.streams.codec")
    pub_id, errors = rbfly_codec.decode_publish_error(publish_errors[0][4:], 0)
    assert [e[1] for e in errors] == [6] * len(errors) and len(errors) == 3


# --------------------------------------------------------------------------- RocketMQ

@pytest.mark.parametrize("serialize", ["json", "rocketmq"])
def test_loadgen_rocketmq_client_reports_the_injected_code(lt, serialize):
    from loadgen.rocketmq.client import RocketMQClient, RocketMQServerError
    from loadgen.rocketmq.server import RocketMQServerThread
    from proxy.protocols.rocketmq.constants import SEND_MESSAGE_V2
    code, label = rocketmq_faults.error_status("SYSTEM_BUSY")
    remaining = [1]

    def inject(frame):
        cmd_code = rocketmq_faults._request(frame)[1]
        if cmd_code == SEND_MESSAGE_V2 and remaining[0]:
            remaining[0] -= 1
            return rocketmq_faults.error_reply(
                frame, code, label, "[REJECTREQUEST]system busy, start flow control")
        return None

    with RocketMQServerThread() as srv:
        relay = InjectingRelay(lt, srv.broker_port, _u32_len(0), inject)
        try:
            with RocketMQClient("127.0.0.1", relay.port, serialize=serialize) as c:
                with pytest.raises(RocketMQServerError) as e:
                    c.send("TopicTest", b"first", queue_id=0)
                assert (e.value.code, e.value.status) == (2, "SYSTEM_BUSY")
                assert e.value.remark == "[REJECTREQUEST]system busy, start flow control"
                assert c.send("TopicTest", b"second", queue_id=0)   # forwarded: stored
        finally:
            relay.close()
    assert len(relay.injected) == 1


# --------------------------------------------------------------------------- FlyMQ

def _flymq_len(buf):
    return 8 + struct.unpack_from(">I", buf, 4)[0] if len(buf) >= 8 else None


def test_loadgen_flymq_client_reports_the_injected_error(lt):
    from loadgen.flymq.client import FlyMQClient, FlyMQServerError
    from loadgen.flymq.server import FlyMQServerThread
    from proxy.protocols.flymq.constants import PRODUCE

    def inject(frame):
        if frame[2] == PRODUCE and b"refused" in frame:
            return flymq_faults.error_reply(frame, *flymq_faults.error_status("ERROR"),
                                            "partition leader not available")
        return None

    with FlyMQServerThread() as srv:
        relay = InjectingRelay(lt, srv.port, _flymq_len, inject)
        try:
            with FlyMQClient("127.0.0.1", relay.port) as c:
                c.create_topic("t")
                c.produce("t", b"ok")
                with pytest.raises(FlyMQServerError) as e:
                    c.produce("t", b"refused")
                assert e.value.message == "partition leader not available"
                assert e.value.opcode == PRODUCE
                assert [s.status for s in c.recent][-1] == "ERROR"
                c.produce("t", b"ok again")                # FIFO order intact
        finally:
            relay.close()
    assert len(relay.injected) == 1


# --------------------------------------------------------------------------- fleximq

def test_fleximq_reference_client_sees_the_injected_status(lt):
    from loadgen.fleximq.client import FlexiMQClient, FlexiMQError
    from loadgen.fleximq.server import FlexiMQBrokerThread
    from proxy.protocols.fleximq.header import REQ
    code, label = fleximq_faults.error_status("SERVICE_UNAVAILABLE")

    def inject(frame):
        if frame[1] == REQ and b"refuse-me" in frame:
            return fleximq_faults.error_reply(frame, code, label, "responder overloaded")
        return None

    def frame_len(buf):
        if len(buf) < 34:
            return None
        hlen, plen = struct.unpack_from(">IQ", buf, 22)
        return 34 + hlen + plen

    with FlexiMQBrokerThread() as broker:
        relay = InjectingRelay(lt, broker.port, frame_len, inject)
        try:
            with FlexiMQClient("127.0.0.1:%d" % relay.port) as requester, \
                    FlexiMQClient(broker.address) as responder:
                requester.join()
                target = responder.join()
                with pytest.raises(FlexiMQError) as e:
                    requester.request(target, "/svc", {"q": "refuse-me"}, timeout=5)
                assert e.value.status == 503
                assert "responder overloaded" in str(e.value)
                assert e.value.frame.client_id == 1
                rid = requester.send_request(target, "/svc", {"q": "fine"})
                req = responder.next_request(timeout=5)
                responder.reply(req, {"a": 1})
                assert requester.wait_reply(rid, timeout=5).body() == {"a": 1}
        finally:
            relay.close()
    assert len(relay.injected) == 1


@pytest.mark.slow
def test_apache_cpp_rocketmq_producer_reports_the_injected_code(lt):
    """Apache's C++ client (PyPI ``rocketmq`` 0.4.4, tests/rocketmq_real_client.py): the
    name server's route data names the relay in front of the broker; every SEND_MESSAGE
    of message 1 is answered SYSTEM_BUSY (retries included), the others are stored.
    JSON headers, the CPP language and version 63 on the request: the reply is JSON."""
    import os
    from tests.rocketmq_real_client import real_client_skip_reason, run_producer
    from loadgen.rocketmq.server import RocketMQServerThread
    from proxy.protocols.rocketmq.constants import SEND_MESSAGE
    reason = real_client_skip_reason()
    if reason:
        if os.environ.get("FRAMETAP_CI"):
            pytest.fail(f"Apache's RocketMQ client must be available in CI: {reason}")
        pytest.skip(f"Apache's RocketMQ client not available: {reason}")
    code, label = rocketmq_faults.error_status("SYSTEM_BUSY")

    def inject(frame):
        if rocketmq_faults._request(frame)[1] == SEND_MESSAGE and frame.endswith(b"message 1"):
            return rocketmq_faults.error_reply(frame, code, label,
                                               "[REJECTREQUEST]system busy, injected")
        return None

    with RocketMQServerThread(queues=1) as srv:
        relay = InjectingRelay(lt, srv.broker_port, _u32_len(0), inject)
        srv.server.advertised_broker = ("127.0.0.1", relay.port)
        try:
            produced = run_producer(srv.namesrv_address, "BusyTopic", n=3, timeout=60,
                                    body="frametap real-client message {i}")
        finally:
            relay.close()
    assert produced["sent"] == 2, produced
    assert len(produced["errors"]) == 1 and produced["errors"][0].startswith("send 1:"), produced
    # The client decodes the response (its log: code and remark) and retries; after its
    # retries it reports its own "No route info" error, not the code.
    assert "processSendResponse error remark:[REJECTREQUEST]system busy, injected, " \
        "error code:2" in produced["client_log"], produced
    assert len(relay.injected) >= 2                  # the first send and its retries
