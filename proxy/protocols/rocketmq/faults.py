"""RocketMQ error replies for the fault engine (interface: proxy/protocols/fault_replies.py).

The reply is what a Java broker sends when it refuses a request (``NettyRemotingAbstract``
/ ``RemotingCommand.createResponseCommand``): a response command with the request's
``opaque``, ``flag`` bit 0 set, the ResponseCode as ``code``, the message as ``remark``,
no extFields and no body, in the request's header serialisation (the high byte of the
header-length word: JSON or ROCKETMQ binary).  ``language`` is ``JAVA`` (the broker's own,
as every Java broker answers) and ``version`` the request's (a broker of the client's
version; the real broker writes its own ``MQVersion``, which the proxy cannot know).  The
length word counts itself exactly when the request's did (route option
``length_includes_self``): the reply is framed like the request.

No reply (None): oneway requests (``flag`` bit 1) and frames with ``flag`` bit 0 set
(responses, and the Go client's oneway requests, docs/design.md "RocketMQ remoting").
"""

import json
import struct

from proxy.protocols.fault_replies import FaultReplyError, default_message, resolve_status
from proxy.protocols.rocketmq import jsonscan
from proxy.protocols.rocketmq.codec import RemotingCommand, encode
from proxy.protocols.rocketmq.constants import (FLAG_ONEWAY, FLAG_RESPONSE, RESPONSE_CODES,
                                            SERIALIZE_JSON, SERIALIZE_ROCKETMQ, response_name)

__all__ = ["DEFAULT_ERROR", "ERROR_NAMES", "error_status", "error_reply", "is_request"]

PROTOCOL = "rocketmq"
DEFAULT_ERROR = "SYSTEM_ERROR"
#: Codes a reply may carry: the binary header's code is a 16-bit short, and the parsers
#: read it unsigned, so the negative client-side RPC_* codes are left out.
CODE_MIN, CODE_MAX = 1, 0x7FFF
#: ResponseCode names accepted as a rule's ``status`` (SUCCESS is no error).
ERROR_NAMES = {name: code for code, name in RESPONSE_CODES.items()
               if CODE_MIN <= code <= CODE_MAX}

_HEAD = struct.Struct(">II")
_BIN = struct.Struct(">HBhii")          # code, language, version, opaque, flag


def error_status(value):
    """``(code, label)`` of a ResponseCode name (``SYSTEM_BUSY``) or number (``2``)."""
    return resolve_status(PROTOCOL, value, ERROR_NAMES, response_name, CODE_MIN, CODE_MAX,
                          hint="; SUCCESS is not an error")


def _request(request):
    """(serialize type, code, version, opaque, flag, length counts itself) of one whole
    frame; FaultReplyError when it is not one."""
    b = bytes(request)
    n = len(b)
    if n < 8:
        raise FaultReplyError(f"rocketmq: a frame has at least 8 bytes, got {n}")
    length, word = _HEAD.unpack_from(b)
    if length + 4 == n:
        includes_self = False
    elif length == n:
        includes_self = True
    else:
        raise FaultReplyError(
            f"rocketmq: length field {length} does not describe the {n}-byte frame "
            f"(expected {n - 4}, or {n} when the length counts itself)")
    stype, hlen = word >> 24, word & 0xFFFFFF
    if stype not in (SERIALIZE_JSON, SERIALIZE_ROCKETMQ):
        raise FaultReplyError(
            f"rocketmq: serialization type {stype} at offset 4 (expected 0 JSON or 1 ROCKETMQ)")
    if 8 + hlen > n:
        raise FaultReplyError(
            f"rocketmq: header length {hlen} at offset 4 runs past the {n}-byte frame")
    h = b[8:8 + hlen]
    if stype == SERIALIZE_ROCKETMQ:
        if hlen < 13:
            raise FaultReplyError(
                f"rocketmq: binary header of {hlen} bytes is shorter than its 13 fixed bytes")
        code, _lang, version, opaque, flag = _BIN.unpack_from(h)
    else:
        try:
            code, opaque, flag = jsonscan.scan(h)      # what the parsers read
        except ValueError as exc:
            raise FaultReplyError(f"rocketmq: JSON header is not readable: {exc}") from None
        version = _json_version(h)
    return stype, code, version, opaque, flag, includes_self


def _json_version(h):
    """The JSON header's ``version`` (0 when absent or not a 32-bit integer)."""
    try:
        v = json.loads(h).get("version", 0)
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not -0x80000000 <= v <= 0x7FFFFFFF:
        return 0
    return v


def is_request(request):
    """True for a request that expects a response (neither a response nor oneway)."""
    try:
        flag = _request(request)[4]
    except ValueError:
        return False
    return not flag & (FLAG_RESPONSE | FLAG_ONEWAY)


def error_reply(request, code, label, message=""):
    """The broker's error response to ``request`` (one whole frame), or None."""
    stype, _req_code, version, opaque, flag, includes_self = _request(request)
    if flag & (FLAG_RESPONSE | FLAG_ONEWAY):
        return None
    if isinstance(code, bool) or not isinstance(code, int) or not CODE_MIN <= code <= CODE_MAX:
        raise FaultReplyError(f"rocketmq: reply code {code!r} is not in {CODE_MIN}..{CODE_MAX}")
    if stype == SERIALIZE_ROCKETMQ and not -0x8000 <= version <= 0x7FFF:
        version = 0
    cmd = RemotingCommand(code=code, language="JAVA", version=version, opaque=opaque,
                          flag=FLAG_RESPONSE, remark=default_message(PROTOCOL, label, message),
                          serialize_type=stype)
    return encode(cmd, length_includes_self=includes_self)
