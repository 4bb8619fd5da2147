"""The Stream load client speaks through the protocol's codec: its string rules (int16
length + UTF-8, -1 = null; PROTOCOL.adoc) are the codec's. Real sockets on 127.0.0.1."""

import socket
import struct
import threading

import pytest

from loadgen.rabbitmq_stream.client import StreamClient, StreamProtocolError
from loadgen.rabbitmq_stream.server import StreamBrokerThread
from proxy.protocols.rabbitmq_stream import constants as C
from proxy.protocols.rabbitmq_stream.codec import (
    StreamCodecError,
    decode_command,
    encode_frame,
)


class OneShotServer:
    """Accepts one connection, reads one request and answers with ``answer(corr)``."""

    def __init__(self, answer):
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(5)
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">I", buf)[0]:
                buf += conn.recv(65536)
            request = decode_command(buf[:4 + struct.unpack_from(">I", buf)[0]])
            self.requests.append(request)
            conn.sendall(self.answer(request.correlation_id))
            try:
                while conn.recv(65536):  # ignore the rest until the client hangs up
                    pass
            except OSError:
                pass

    def close(self):
        self.listener.close()
        self.thread.join(5)


def _peer_properties_answer(value: bytes):
    def answer(corr):
        body = struct.pack(">IHi", corr, C.OK, 1) + struct.pack(">H", 1) + b"k" + \
            struct.pack(">H", len(value)) + value
        return encode_frame(C.PEER_PROPERTIES | C.RESPONSE_BIT, 1, body)
    return answer


def test_invalid_utf8_from_the_server_is_a_protocol_error():
    server = OneShotServer(_peer_properties_answer(b"\xff\xfe"))
    try:
        with pytest.raises(StreamProtocolError, match="not valid UTF-8") as info:
            StreamClient("127.0.0.1", server.port, timeout=5)
        assert info.value.command == "PeerProperties"
        assert server.requests[0].properties["product"] == "frametap"
    finally:
        server.close()


def test_null_string_from_the_server_reads_as_none():
    def answer(corr):  # a property whose value is the null string (length -1)
        body = struct.pack(">IHi", corr, C.OK, 1) + struct.pack(">H", 1) + b"k" + \
            struct.pack(">h", -1)
        # then end the handshake: SaslHandshake will time out, which is fine here
        return encode_frame(C.PEER_PROPERTIES | C.RESPONSE_BIT, 1, body)

    server = OneShotServer(answer)
    try:
        with pytest.raises(TimeoutError) as info:
            StreamClient("127.0.0.1", server.port, timeout=0.5)
        assert info.value.command == "SaslHandshake"  # PeerProperties was understood
    finally:
        server.close()


def test_strings_the_protocol_cannot_carry_are_refused_before_sending():
    with StreamBrokerThread() as broker, StreamClient("127.0.0.1", broker.port) as client:
        with pytest.raises(StreamCodecError, match="UTF-8"):
            client.create("bad-\ud800")          # a lone surrogate has no UTF-8 form
        with pytest.raises(ValueError, match="32767"):
            client.create("x" * 40000)           # over int16
        assert client.create("fine-é")           # the connection is still usable
        assert client.metadata("fine-é").streams["fine-é"].code == C.OK
        client.declare_publisher(1, "fine-é")     # no reference: the empty string
        assert client.wait_confirms(1, client.publish_batch(1, [b"m"]), timeout=5).complete
