"""fleximq codec: whole frames (the fleximq document with docs/design.md, "fleximq").

Pure Python, ``msgpack`` for the header and the payload; used by the reference broker,
the sync client, the Locust users and the tests, never by the proxy's hot path.

    encode(mtype, client_id, header, payload)     -> bytes of one frame
    decode(buf, max_frame_bytes)                  -> (Frame, bytes used) or None (incomplete)
    FrameReader(...).feed(data) -> [Frame]        -> frames as they complete

The 34-byte prefix is version u8, type u8, client_id u32, 16 reserved bytes,
header_length u32, payload_length u64 (big-endian), then the header (a MessagePack map),
then the payload (MessagePack).  Limits (§7.1) are checked on the prefix, before anything
is buffered: a header over 64 KiB or a frame over ``max_frame_bytes`` (1 GiB) raises
:class:`FlexiMQCodecError`.  Reserved bytes are kept as read and ignored (§7.3.1).
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field

import msgpack

from proxy.protocols.fleximq.header import (JOIN, REQ, REP, NOTIF, BCAST, PUB, SUB, UNSUB,
                                            PING, PONG, TYPE_NAMES)
from proxy.protocols.fleximq.constants import (PREFIX, MAX_HEADER_BYTES, MAX_FRAME_BYTES,
                                           VERSION, BROKER_ID, log_correlation_id)

__all__ = ["JOIN", "REQ", "REP", "NOTIF", "BCAST", "PUB", "SUB", "UNSUB", "PING", "PONG",
           "TYPE_NAMES", "PREFIX", "VERSION", "BROKER_ID", "FlexiMQCodecError", "Frame",
           "encode", "decode", "FrameReader", "ulid", "now_ms", "log_correlation_id",
           "join", "req", "rep", "notif", "bcast", "pub", "sub", "unsub", "ping", "pong"]

_PREFIX = struct.Struct(">BBI16sIQ")
ZERO16 = b"\0" * 16


class FlexiMQCodecError(ValueError):
    """A frame that breaks the framing or its limits."""


@dataclass
class Frame:
    type: int
    client_id: int = 0
    header: dict = field(default_factory=dict)
    payload: bytes = b""                  # the MessagePack bytes, as sent
    version: int = VERSION
    reserved: bytes = ZERO16
    header_error: str | None = None       # the header was not a decodable map

    @property
    def name(self):
        return TYPE_NAMES[self.type] if self.type < len(TYPE_NAMES) else "unknown_%d" % self.type

    def body(self):
        """The payload decoded (None when empty)."""
        return msgpack.unpackb(self.payload, raw=False) if self.payload else None

    @property
    def rid(self):
        rr = self.header.get("reqrep")
        return rr.get("id") if isinstance(rr, dict) else None

    @property
    def status(self):
        return self.header.get("status")

    def encode(self):
        return encode(self.type, self.client_id, self.header, raw_payload=self.payload,
                      version=self.version, reserved=self.reserved)


def encode(mtype, client_id=0, header=None, payload=None, *, raw_payload=None,
           raw_header=None, version=VERSION, reserved=ZERO16):
    """One frame.  ``header``: a dict (MessagePack-encoded; empty/None: no header bytes)
    or ``raw_header`` bytes; ``payload``: any MessagePack-able value, or ``raw_payload``."""
    if raw_header is None:
        raw_header = msgpack.packb(header, use_bin_type=True) if header else b""
    if raw_payload is None:
        raw_payload = msgpack.packb(payload, use_bin_type=True) if payload is not None else b""
    return (_PREFIX.pack(version, mtype, client_id, reserved, len(raw_header),
                         len(raw_payload)) + raw_header + raw_payload)


def decode_prefix(buf, max_frame_bytes=MAX_FRAME_BYTES):
    """(version, type, client_id, reserved, header_length, payload_length) of a prefix."""
    v, t, cid, res, hlen, plen = _PREFIX.unpack_from(buf)
    if hlen > MAX_HEADER_BYTES:
        raise FlexiMQCodecError("header length %d exceeds the limit %d" % (hlen,
                                                                           MAX_HEADER_BYTES))
    if PREFIX + hlen + plen > max_frame_bytes:
        raise FlexiMQCodecError("frame of %d bytes exceeds the limit %d" % (
            PREFIX + hlen + plen, max_frame_bytes))
    return v, t, cid, res, hlen, plen


def decode(buf, max_frame_bytes=MAX_FRAME_BYTES):
    """One whole frame from the start of buf: (Frame, bytes used), or None when buf does
    not hold it yet.  A header that is not a decodable MessagePack map leaves
    ``header = {}`` and says why in ``header_error`` (the frame itself is intact)."""
    if len(buf) < PREFIX:
        return None
    v, t, cid, res, hlen, plen = decode_prefix(buf, max_frame_bytes)
    end = PREFIX + hlen + plen
    if len(buf) < end:
        return None
    raw = bytes(buf[PREFIX:PREFIX + hlen])
    header, err = {}, None
    if raw:
        try:
            header = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as e:          # invalid MessagePack, bad UTF-8, trailing bytes
            header, err = {}, "invalid MessagePack header: %s" % e
        else:
            if not isinstance(header, dict):
                header, err = {}, "header is a %s, not a map" % type(header).__name__
    return Frame(t, cid, header, bytes(buf[PREFIX + hlen:end]), v, res, err), end


class FrameReader:
    """Incremental decoding of a byte stream.  The buffer never holds more than one
    frame's prefix + what that frame declared (checked against the limits first)."""

    def __init__(self, max_frame_bytes=MAX_FRAME_BYTES):
        self.buf = bytearray()
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data):
        self.buf += data
        out = []
        while True:
            got = decode(self.buf, self.max_frame_bytes)
            if got is None:
                return out
            frame, used = got
            del self.buf[:used]
            out.append(frame)


# ---- ids and builders -----------------------------------------------------------------

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(ms=None):
    """A ULID (48-bit millisecond time + 80 random bits, Crockford base32): the id the
    document recommends for reqrep.id."""
    ms = int(time.time() * 1000) if ms is None else ms
    v = (ms << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(v >> (5 * i)) & 31] for i in range(25, -1, -1))


def now_ms():
    return int(time.time() * 1000)


def join(auth=None, rid=None):
    h = {}
    if auth is not None:
        h["auth"] = auth
    if rid is not None:
        h["reqrep"] = {"type": "request", "id": rid}
    return encode(JOIN, 0, h)


def _routing(targets, path):
    if isinstance(targets, int):
        targets = [targets]
    entries = []
    for t in targets:
        e = {"client_id": t}
        if path is not None:
            e["path"] = path
        entries.append(e)
    return entries


def req(client_id, target, rid, path=None, payload=None, status=None):
    h = {"routing": _routing(target, path), "reqrep": {"type": "request", "id": rid}}
    if status is not None:
        h["status"] = status
    return encode(REQ, client_id, h, payload)


def rep(client_id, requester, rid, status=None, payload=None, path=None):
    h = {"routing": _routing(requester, path), "reqrep": {"type": "correlation", "id": rid}}
    if status is not None:
        h["status"] = status
    return encode(REP, client_id, h, payload)


def notif(client_id, targets, path=None, payload=None, status=None):
    h = {"routing": _routing(targets, path)}
    if status is not None:
        h["status"] = status
    return encode(NOTIF, client_id, h, payload)


def bcast(client_id, payload=None, status=None):
    return encode(BCAST, client_id, {"status": status} if status is not None else None,
                  payload)


def pub(client_id, topic, payload=None, routing=None, status=None):
    h = {"topic": topic}
    if routing is not None:
        h["routing"] = routing
    if status is not None:
        h["status"] = status
    return encode(PUB, client_id, h, payload)


def sub(client_id, topic):
    return encode(SUB, client_id, {"topic": topic})


def unsub(client_id, topic):
    return encode(UNSUB, client_id, {"topic": topic})


def ping(client_id, ts=None, interval=None):
    ka = {"timestamp": now_ms() if ts is None else ts}
    if interval is not None:
        ka["interval"] = interval
    return encode(PING, client_id, {"keepalive": ka})


def pong(client_id, ts):
    return encode(PONG, client_id, {"keepalive": {"timestamp": ts}})
