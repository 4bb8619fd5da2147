"""Top-level field scanner for RocketMQ JSON headers (pure Python; the twin of the
scanner in _parser.pyx, same algorithm so both parsers agree byte for byte).

Reads ``code``, ``opaque`` and ``flag`` of the top-level object without building the
header: nested objects (``extFields`` may repeat those names) are skipped
structurally, strings with their escapes.  A key containing an escape, or a wanted
value that is not a plain integer, falls back to ``json.loads`` — correct for every
valid JSON, fast for what clients really send.
"""

import json
import math

WS = b" \t\r\n"
WANTED = {b"code": 0, b"opaque": 1, b"flag": 2}


class ScanError(ValueError):
    pass


def _ws(b, i, n):
    while i < n and b[i] in WS:
        i += 1
    return i


def _string_end(b, i, n):
    """i at the opening quote; returns (index after the closing quote, had_escape)."""
    i += 1
    esc = False
    while i < n:
        c = b[i]
        if c == 0x22:                      # "
            return i + 1, esc
        if c == 0x5C:                      # backslash: skip the escaped char
            esc = True
            i += 2
            continue
        if c < 0x20:
            raise ScanError("control character in string")
        i += 1
    raise ScanError("unterminated string")


def _skip_value(b, i, n):
    i = _ws(b, i, n)
    if i >= n:
        raise ScanError("missing value")
    c = b[i]
    if c == 0x22:
        return _string_end(b, i, n)[0]
    if c in (0x7B, 0x5B):                  # { [ : walk to the matching close
        depth = 0
        while i < n:
            c = b[i]
            if c == 0x22:
                i = _string_end(b, i, n)[0]
                continue
            if c in (0x7B, 0x5B):
                depth += 1
            elif c in (0x7D, 0x5D):
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise ScanError("unterminated object or array")
    for lit in (b"true", b"false", b"null"):
        if b[i:i + len(lit)] == lit:
            return i + len(lit)
    j = i
    while j < n and b[j] in b"+-.0123456789eE":
        j += 1
    if j == i:
        raise ScanError("unexpected character %r" % chr(c))
    return j


def _int_value(b, i, n):
    """(value or None when not a plain integer, index after the value)."""
    i = _ws(b, i, n)
    j = i
    if j < n and b[j] == 0x2D:
        j += 1
    k = j
    while k < n and 0x30 <= b[k] <= 0x39:
        k += 1
    if k == j or k - j > 18 or (k < n and b[k] in b".eE"):
        return None, _skip_value(b, i, n)   # not a plain 64-bit integer: fallback
    return _int32(int(b[i:k])), k


def _int32(v, name="value"):
    """code, opaque and flag are Java ints: anything outside 32 bits is a bad header."""
    if not -0x80000000 <= v <= 0x7FFFFFFF:
        raise ScanError(f"{name} {v} is outside the 32-bit range")
    return v


def scan(b):
    """(code, opaque, flag) of a JSON header (bytes-like); missing fields are 0."""
    b = bytes(b)
    n = len(b)
    out = [0, 0, 0]
    i = _ws(b, 0, n)
    if i >= n or b[i] != 0x7B:
        raise ScanError("header is not a JSON object")
    i = _ws(b, i + 1, n)
    if i < n and b[i] == 0x7D:
        return _finish(b, i + 1, n, out)
    while True:
        if i >= n or b[i] != 0x22:
            raise ScanError("expected a key")
        end, esc = _string_end(b, i, n)
        if esc:
            return _fallback(b)
        key = b[i + 1:end - 1]
        i = _ws(b, end, n)
        if i >= n or b[i] != 0x3A:
            raise ScanError("expected ':'")
        slot = WANTED.get(key)
        if slot is None:
            i = _skip_value(b, i + 1, n)
        else:
            v, i = _int_value(b, i + 1, n)
            if v is None:
                return _fallback(b)
            out[slot] = v
        i = _ws(b, i, n)
        if i < n and b[i] == 0x2C:
            i = _ws(b, i + 1, n)
            continue
        if i < n and b[i] == 0x7D:
            return _finish(b, i + 1, n, out)
        raise ScanError("expected ',' or '}'")


def _finish(b, i, n, out):
    if _ws(b, i, n) != n:
        raise ScanError("trailing bytes after the header object")
    return tuple(out)


def _fallback(b):
    """json.loads for what the scanner leaves (escaped keys, floats, long numbers).

    Every failure is a ScanError (a bad_header): malformed or non-UTF-8 JSON, nesting
    deep enough to exhaust the recursion limit, non-finite or fractional numbers, and
    integers outside Java's 32-bit int."""
    try:
        obj = json.loads(b)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ScanError(f"{type(exc).__name__}: {exc}"[:200]) from None
    if not isinstance(obj, dict):
        raise ScanError("header is not a JSON object")
    out = []
    for name in ("code", "opaque", "flag"):
        v = obj.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ScanError(f"{name} is not an integer")
        if isinstance(v, float):
            if not math.isfinite(v) or not v.is_integer():
                raise ScanError(f"{name} is not an integer")
            v = int(v)
        out.append(_int32(v, name))
    return tuple(out)


# ---- the frame log's resource: the topic in extFields -------------------------------
#
# Only while recording.  The same walk as find_member() / topic_of() in _parser.pyx:
# keys are compared as raw bytes (a key spelled with an escape never matches), the last
# member of a name wins (as in json.loads), and anything malformed inside extFields
# (which scan() skips without validating) gives no topic rather than an error.

EXT_FIELDS = b"extFields"
_ESCAPES = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F, 0x62: 0x08, 0x66: 0x0C, 0x6E: 0x0A,
            0x72: 0x0D, 0x74: 0x09}
_HEX = b"0123456789abcdefABCDEF"
_REPLACEMENT = "\ufffd".encode()


def find_member(b, i, n, key):
    """Index of the value of the last member named ``key`` (raw bytes) of the object
    at (or after whitespace from) i, or -1: none, or not a well-formed object."""
    try:
        i = _ws(b, i, n)
        if i >= n or b[i] != 0x7B:
            return -1
        i = _ws(b, i + 1, n)
        if i < n and b[i] == 0x7D:
            return -1
        found = -1
        while True:
            if i >= n or b[i] != 0x22:
                return -1
            end = _string_end(b, i, n)[0]
            match = b[i + 1:end - 1] == key
            i = _ws(b, end, n)
            if i >= n or b[i] != 0x3A:
                return -1
            i = _ws(b, i + 1, n)
            if match:
                found = i
            i = _ws(b, _skip_value(b, i, n), n)
            if i < n and b[i] == 0x2C:
                i = _ws(b, i + 1, n)
                continue
            return found if i < n and b[i] == 0x7D else -1
    except ScanError:
        return -1


def _hex4(s, i):
    if i + 4 > len(s) or any(c not in _HEX for c in s[i:i + 4]):
        return -1
    return int(s[i:i + 4], 16)


def unescape(s):
    """The content of a JSON string (the bytes between its quotes) with its escapes
    decoded, as UTF-8; a lone surrogate becomes U+FFFD; None for an invalid escape.
    Other bytes are kept as they are."""
    out = bytearray()
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            return None
        e = s[i + 1]
        if e != 0x75:                          # \u
            if e not in _ESCAPES:
                return None
            out.append(_ESCAPES[e])
            i += 2
            continue
        cp = _hex4(s, i + 2)
        if cp < 0:
            return None
        i += 6
        if 0xD800 <= cp <= 0xDBFF and i + 1 < n and s[i] == 0x5C and s[i + 1] == 0x75:
            lo = _hex4(s, i + 2)
            if lo < 0:
                return None
            if 0xDC00 <= lo <= 0xDFFF:
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                i += 6
        if 0xD800 <= cp <= 0xDFFF:
            out += _REPLACEMENT
        else:
            out += chr(cp).encode()
    return bytes(out)


def topic(h, key):
    """The string value of extFields[key] in a JSON header that scan() accepted, as
    UTF-8 bytes (escapes decoded), or None."""
    b = bytes(h)
    n = len(b)
    i = find_member(b, 0, n, EXT_FIELDS)
    if i < 0:
        return None
    i = find_member(b, i, n, key)
    if i < 0 or b[i] != 0x22:
        return None
    try:
        end, esc = _string_end(b, i, n)
    except ScanError:
        return None
    raw = b[i + 1:end - 1]
    return unescape(raw) if esc else raw


def binary_topic(h, key):
    """extFields[key] of a ROCKETMQ binary header (codec._decode_binary_header's checks:
    anything cut short or overlong gives None), or None."""
    b = bytes(h)
    n = len(b)
    if n < 21:
        return None
    rl = int.from_bytes(b[13:17], "big", signed=True)
    pos = 17
    if rl < 0 or pos + rl + 4 > n:
        return None
    pos += rl
    el = int.from_bytes(b[pos:pos + 4], "big", signed=True)
    pos += 4
    if el < 0 or pos + el > n:
        return None
    end = pos + el
    found = None
    while pos < end:
        if pos + 2 > end:
            return None
        kl = int.from_bytes(b[pos:pos + 2], "big")
        pos += 2
        if pos + kl + 4 > end:
            return None
        match = b[pos:pos + kl] == key
        pos += kl
        vl = int.from_bytes(b[pos:pos + 4], "big", signed=True)
        pos += 4
        if vl < 0 or pos + vl > end:
            return None
        if match:
            found = b[pos:pos + vl]
        pos += vl
    return found
