"""Synchronous FlyMQ client over a plain ``socket`` (gevent-patchable, used by Locust).

One request in flight at a time, as in the reference SDK: FlyMQ has no correlation id, so
the response to a request is simply the next frame on the connection (docs/design.md, "FlyMQ").
The proxy therefore correlates FIFO, and its frame log's ``correlation_id`` of a request is
the request's 1-based number on its connection; the client counts every request frame it
sends the same way (``requests_sent``, ``recent``: see :class:`loadgen.clientbase.SocketClient`,
whose read loop this client shares; its framing is the codec's :func:`decode_frame`).
Payload layouts are those of :mod:`proxy.protocols.flymq.codec`.

Errors:

* an ERROR (0xFF) response raises :class:`FlyMQServerError` (the connection stays usable);
* a failed AUTH raises :class:`FlyMQAuthError` (a ``FlyMQServerError``);
* a malformed or unexpected response raises :class:`FlyMQCodecError`, and a socket
  error or timeout raises ``OSError``; after either the connection is closed, because
  the request/response pairing can no longer be trusted, and later calls raise
  ``ConnectionError``.
"""

from __future__ import annotations

import socket

from loadgen import clientbase
from proxy.protocols.flymq.codec import (
    AuthRequest,
    AuthResponse,
    CommitRequest,
    CommitResponse,
    ConsumeRequest,
    ConsumeResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    ErrorResponse,
    FetchRequest,
    FetchResponse,
    FlyMQCodecError,
    ListTopicsRequest,
    ListTopicsResponse,
    MetadataRequest,
    MetadataResponse,
    ProduceRequest,
    RecordMetadata,
    SubscribeRequest,
    SubscribeResponse,
    decode_frame,
    encode_frame,
)
from proxy.protocols.flymq.constants import ERROR, FLAG_BINARY, MAX_FRAME_BYTES, opcode_name

__all__ = ["FlyMQClient", "FlyMQServerError", "FlyMQAuthError", "parse_host"]

DEFAULT_PORT = 9092


def parse_host(host: str | None) -> tuple[str, int]:
    """``flymq://h:p``, ``h:p`` or ``h`` -> ``(h, p)``; ValueError otherwise."""
    return clientbase.parse_host(host, ("flymq",), DEFAULT_PORT,
                                 "FlyMQ users need a host: run Locust with --host "
                                 "HOST:PORT (or flymq://HOST:PORT)")


class FlyMQServerError(Exception):
    """The server answered with ERROR (0xFF); ``str(exc)`` is its message."""

    def __init__(self, message: str, opcode: int | None = None):
        super().__init__(message)
        self.message = message
        self.opcode = opcode  # the request opcode that failed


class FlyMQAuthError(FlyMQServerError):
    """AUTH was answered with success = false."""


class FlyMQClient(clientbase.SocketClient):
    """Blocking FlyMQ client; one TCP connection, one request in flight.

    ``last_request_bytes`` / ``last_response_bytes`` hold the frame sizes (header
    included) of the most recent exchange, for load-test accounting.
    """

    what = "flymq"

    def __init__(self, host: str, port: int, timeout: float | None = 10.0,
                 max_frame_bytes: int = MAX_FRAME_BYTES):
        self.host = host
        self.port = int(port)
        self.timeout = timeout
        self.max_frame_bytes = max_frame_bytes
        self.last_request_bytes = 0
        self.last_response_bytes = 0
        self._sock: socket.socket | None = clientbase.connect_tcp(host, self.port, timeout)
        self._connected(self._sock)

    # ------------------------------------------------------------------ plumbing

    def split_frame(self, buf):
        frame = decode_frame(buf, self.max_frame_bytes)
        return None if frame is None else (frame, frame.size)

    def request(self, opcode: int, payload: bytes = b"",
                flags: int = FLAG_BINARY) -> tuple[int, int, bytes]:
        """Send one frame and return the response frame as ``(opcode, flags, payload)``.

        ERROR responses are returned, not raised, at this level.
        """
        frame = encode_frame(opcode, payload, flags)
        try:
            self._send_frame(frame)
            # FIFO correlation: the request's number on this connection
            sent = self._sent(str(self.requests_sent + 1), opcode, opcode_name(opcode))
            response = self._read_frame()      # within the socket's timeout
            sent.status = "ERROR" if response.opcode == ERROR else "OK"
        except BaseException:
            # Half-done exchange: the next frame on this socket can't be paired safely.
            self.close()
            raise
        self.last_request_bytes = len(frame)
        self.last_response_bytes = response.size
        return response.opcode, response.flags, response.payload

    def _call(self, message, response_cls):
        opcode = message.OPCODE
        resp_opcode, _flags, payload = self.request(opcode, message.encode())
        if resp_opcode == ERROR:
            try:
                text = ErrorResponse.decode(payload).message
            except FlyMQCodecError as exc:
                text = f"undecodable ERROR response: {exc}"
            raise FlyMQServerError(text, opcode)
        if resp_opcode != response_cls.OPCODE:  # the request's opcode; AUTH_RESPONSE for AUTH
            self.close()
            raise FlyMQCodecError(
                f"flymq: expected a {opcode_name(opcode)} response, got opcode "
                f"0x{resp_opcode:02X} ({opcode_name(resp_opcode)})", "mismatch")
        try:
            return response_cls.decode(payload)
        except FlyMQCodecError:
            self.close()
            raise

    # ------------------------------------------------------------------ operations

    def produce(self, topic: str, value: bytes, key: bytes | None = None,
                partition: int = -1) -> RecordMetadata:
        """PRODUCE one record; returns where it was stored."""
        return self._call(ProduceRequest(topic, value, key, partition), RecordMetadata)

    def consume(self, topic: str, partition: int, offset: int) -> ConsumeResponse:
        """CONSUME the record at ``offset`` (``.key``, ``.value``)."""
        return self._call(ConsumeRequest(topic, partition, offset), ConsumeResponse)

    def fetch(self, topic: str, partition: int, offset: int,
              max_messages: int = 100) -> FetchResponse:
        """FETCH up to ``max_messages`` records (``.messages``, ``.next_offset``)."""
        return self._call(FetchRequest(topic, partition, offset, max_messages), FetchResponse)

    def fetch_filtered(self, topic: str, partition: int, offset: int, max_messages: int,
                       filter_text: str) -> FetchResponse:
        """FETCH with the newer servers' trailing filter: only records whose value or key
        contains ``filter_text``."""
        return self._call(FetchRequest(topic, partition, offset, max_messages, filter_text),
                          FetchResponse)

    def create_topic(self, topic: str, partitions: int = 1) -> CreateTopicResponse:
        """CREATE_TOPIC (``.success``; a topic that exists is a success, as on the real
        server); a refusal raises :class:`FlyMQServerError`."""
        return self._call(CreateTopicRequest(topic, partitions), CreateTopicResponse)

    def metadata(self, topic: str) -> MetadataResponse:
        """METADATA: per partition id, leader, oldest and newest offset (``.partitions``
        is the count, ``.high_watermarks`` the newest offsets)."""
        return self._call(MetadataRequest(topic), MetadataResponse)

    def subscribe(self, topic: str, group: str, partition: int = 0,
                  mode: str = "earliest") -> int:
        """SUBSCRIBE; returns the starting offset."""
        return self._call(SubscribeRequest(topic, group, partition, mode),
                          SubscribeResponse).offset

    def commit(self, topic: str, group: str, partition: int, offset: int) -> bool:
        """COMMIT a consumer-group offset; returns the server's success flag."""
        return self._call(CommitRequest(topic, group, partition, offset),
                          CommitResponse).success

    def list_topics(self) -> list[str]:
        """LIST_TOPICS."""
        return self._call(ListTopicsRequest(), ListTopicsResponse).topics

    def delete_topic(self, topic: str) -> DeleteTopicResponse:
        """DELETE_TOPIC (``.success``; a missing topic is a success, as on the real
        server)."""
        return self._call(DeleteTopicRequest(topic), DeleteTopicResponse)

    def auth(self, user: str, password: str) -> AuthResponse:
        """AUTH; raises :class:`FlyMQAuthError` when the server refuses."""
        resp = self._call(AuthRequest(user, password), AuthResponse)
        if not resp.success:
            raise FlyMQAuthError(resp.error or "authentication failed", AuthRequest.OPCODE)
        return resp
