"""Fuzz every protocol's parser twins in process: mutated frames through the compiled
parser and its pure-Python twin, which must agree, never raise, and stay within a time
budget; then adversarial inputs built to make a parser do more than linear work.

Mutated frames: each case takes 1-8 frames from the protocol's corpus (its golden
conversations, its garbage cases and its benchmark samples), mutates some (a byte set at
random, a length field's bytes, a cut, an insertion, a frame repeated, bytes swapped),
cuts the stream into random reads and feeds both twins, then closes them. Counted:
frames fed, exceptions escaping ``feed``/``close`` (must be 0), cases where the twins'
counters, return values or fatal error differ (must be 0), and cases slower than the
budget (must be 0). A failing case is printed (hex) and the run goes on.

Time budget (issue 19: no input may cost more than linear time): the CPU time of one
case in one twin (``time.thread_time``, so other processes do not count) must stay below
``per_byte * bytes + per_read * reads + constant``, per twin (BUDGETS): compiled 0.25 us
a byte + 2 us a read + 20 ms; pure Python 10 us a byte + 50 us a read + 50 ms.  A case
that re-reads a structure from its start for every piece of it, or whose ids all collide
in the pending map, costs quadratic time and blows it for inputs of a few 10 KB.

Adversarial inputs (GENERATORS, per protocol): long structures (Thrift lists, maps,
struct fields and deep nesting, unframed and in framed EXCEPTIONs behind big info
sections; RocketMQ JSON and binary headers with thousands of fields, nested JSON, batch
bodies, a route answer held for rewriting; fleximq MessagePack headers with thousands of
routing targets or keys and deep nesting; FlyMQ runs of small frames; Stream Publish,
Publish v1/v2 mixing sub-entry batches, PublishConfirm and a rewritten Metadata answer)
fed whole, cut at every element boundary, and (up to --bytes-max) one byte a read: each
must agree across twins and cuts and stay within the budget.  Floods: --flood requests whose correlation ids collide
in the compiled pending map's hash as it was unkeyed (``_mix``, now in proxy/_pending.pxd,
on 8d1b3c1: pending_mix) — Thrift seq ids, RocketMQ opaques, fleximq PING timestamps,
Stream publishing and correlation ids (FlyMQ correlates FIFO: nothing to collide) — must
cost at most FLOOD_RATIO (2) times the same requests with random ids (plus 2 ms; the
fastest of FLOOD_ROUNDS interleaved runs of each), and stay
within the budget.  On 8d1b3c1 they cost 50-300x; the map's hash is now keyed by a
secret per-connection seed, which ids chosen offline cannot know.

    python bench/fuzz_twins.py [--protocol NAME|all] [--frames N] [--seed S]
        [--size BYTES] [--flood N] [--bytes-max BYTES] [--no-adversarial]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import random
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Per twin: (ns a byte, us a read, ms a case) of CPU time (module docstring).
BUDGETS = {"c": (250.0, 2.0, 20.0), "py": (10_000.0, 50.0, 50.0)}
FLOOD_RATIO = 2.0            # a flood of colliding ids vs the same requests, random ids
FLOOD_SLACK = 0.002          # s: plus this, for a flood whose random-id run takes ~1 ms
FLOOD_ROUNDS = 3             # interleaved runs of each; the ratio is of the fastest ones
PROGRESS_SECONDS = 10.0      # a progress line at most this often on long runs


def budget_seconds(twin, nbytes, nreads):
    """The CPU seconds a case of nbytes in nreads reads may take in twin "c" or "py"."""
    per_byte, per_read, const = BUDGETS[twin]
    return per_byte * 1e-9 * nbytes + per_read * 1e-6 * nreads + const * 1e-3

def _corpus(spec) -> list[tuple[int, bytes]]:
    conf = spec.load_conformance()
    out = []
    for conv in conf.conversations():
        out.extend((d, bytes(f)) for d, f in conv.steps)
    for g in conf.garbage():
        out.append((g.direction, bytes(g.data)))
    samples = spec.load_samples()
    _desc, reqs, resps = samples.bench_frames(16, 64)
    out.extend((0, bytes(f)) for f in reqs[:16])
    out.extend((1, bytes(f)) for f in resps[:16])
    return [(d, f) for d, f in out if f]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.randrange(7)
        if not b:
            b = bytearray(rng.randbytes(rng.randrange(1, 16)))
            continue
        k = rng.randrange(len(b))
        if op == 0:                                    # one byte at random
            b[k] = rng.randrange(256)
        elif op == 1:                                  # a length-ish field: extremes
            v = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0xFFFFFFFF, len(b)))
            w = rng.choice((1, 2, 4))
            b[k:k + w] = v.to_bytes(8, "big")[-w:]
        elif op == 2:                                  # cut
            del b[rng.randrange(len(b)):]
        elif op == 3:                                  # insertion
            b[k:k] = rng.randbytes(rng.randrange(1, 9))
        elif op == 4:                                  # deletion
            del b[k:k + rng.randrange(1, 9)]
        elif op == 5:                                  # swap two bytes
            j = rng.randrange(len(b))
            b[k], b[j] = b[j], b[k]
        else:                                          # bit flip
            b[k] ^= 1 << rng.randrange(8)
    return bytes(b)


def _splits(rng: random.Random, data: bytes) -> list[bytes]:
    out, k = [], 0
    while k < len(data):
        n = rng.choice((1, 3, 7, 64, 4096, 1 << 20))
        out.append(data[k:k + n])
        k += n
    return out


# ==== Adversarial inputs (issue 19: every input costs time linear in its size) ========
#
# Each generator builds one protocol's worst cases for a parser that re-reads a
# structure from its start whenever more of it arrives: long structures (split at every
# element boundary, or at every byte), deep nesting, and many requests whose correlation
# ids collide in the compiled pending map's hash.  An Attack's steps are
# (direction, bytes, cuts): ``cuts`` are the element boundaries inside those bytes.

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


class Attack(NamedTuple):
    protocol: str
    name: str
    steps: list                  # [(direction, bytes, [element boundaries])]
    options: dict = {}
    flood: bool = False          # many requests with colliding correlation ids


def _be(n, v):
    return v.to_bytes(n, "big", signed=v < 0)


# ---- colliding ids: the compiled pending map's hash (_mix in proxy/_pending.pxd) ----

def pending_mix(tag, key):
    """_mix(tag, key) of the pending map (proxy/_pending.pxd today) as it was before it had a seed (8d1b3c1:
    splitmix64's finalizer, invertible): a pending request's slot was
    pending_mix(...) & (capacity - 1).  With a secret seed these ids are random ones."""
    z = (key + (tag << 56) + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _unshift(y, s):
    x = y
    for _ in range(64 // s + 1):
        x = y ^ (x >> s)
    return x


def colliding_keys64(tag, n, bits=16):
    """n 64-bit keys whose pending_mix(tag, key) has its low `bits` bits 0: every one
    probes the same cluster in any table of at most 2**bits slots (inverted, instant)."""
    inv2, inv1 = pow(0x94D049BB133111EB, -1, 1 << 64), pow(0xBF58476D1CE4E5B9, -1, 1 << 64)
    out = []
    for k in range(1, n + 1):
        z = _unshift(k << bits, 31)
        z = _unshift((z * inv2) & M64, 27)
        z = _unshift((z * inv1) & M64, 30)
        out.append((z - GOLDEN - (tag << 56)) & M64)
    return out


_KEYS31 = {}


def flood_ids(tag, n, wide, collide=True):
    """n correlation ids for a flood under `tag`: colliding ones (64-bit keys when
    `wide`, else 31-bit), or as many random ones of the same width (the baseline)."""
    if collide:
        return colliding_keys64(tag, n) if wide else colliding_keys31(tag, n)
    rng = random.Random(n * 1000 + tag)
    return [rng.getrandbits(64) if wide else rng.randrange(1, 1 << 31) for _ in range(n)]


def colliding_keys31(tag, n, bits=16, window=1024):
    """n keys in 1..2**31-1 (Thrift seq ids, RocketMQ opaques, Stream correlation ids)
    whose pending_mix(tag, key) & (2**bits - 1) < window: found by brute force (about
    2**bits / window tries a key); in any table of 2 * window .. 2**bits slots they all
    fall in one run of `window` slots."""
    got = _KEYS31.setdefault((tag, bits, window), [])
    k = got[-1] + 1 if got else 1
    mask = (1 << bits) - 1
    base = GOLDEN + (tag << 56)
    while len(got) < n:
        z = (k + base) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        if (z ^ (z >> 31)) & mask < window:
            got.append(k)
        k += 1
    return got[:n]


# ---- ttheader ------------------------------------------------------------------------

def _thrift_call(mtype, seq, name=b"adversary"):
    return b"\x80\x01\x00" + bytes([mtype]) + _be(4, len(name)) + name + _be(4, seq)


def _uvar(v):
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        if not v:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def _joined(head, parts, tail=b""):
    """(bytes, cuts): head + parts + tail, cut after the head and after every part."""
    cuts, k = [], len(head)
    for p in parts:
        cuts.append(k)
        k += len(p)
    cuts.append(k)
    return head + b"".join(parts) + tail, cuts


def ttheader_attacks(size, flood=60_000, collide=True):
    limit = (128 << 10) - 64                    # the ttheader header_limit, less headers
    n = max(16, min(size, limit))
    out = []
    # unframed: its end is found by walking it whole
    head = _thrift_call(1, 7) + b"\x0f\x00\x01\x08" + _be(4, n // 4)
    data, cuts = _joined(head, [_be(4, i) for i in range(n // 4)], b"\x00")
    out.append(Attack("ttheader", "unframed list<i32>", [(0, data, cuts)]))
    data, cuts = _joined(_thrift_call(2, 7), [b"\x08" + _be(2, 1 + i % 9) + _be(4, i)
                                              for i in range(n // 7)], b"\x00")
    out.append(Attack("ttheader", "unframed struct of i32 fields", [(1, data, cuts)]))
    head = _thrift_call(1, 8) + b"\x0f\x00\x01\x0b" + _be(4, n // 12)
    data, cuts = _joined(head, [_be(4, 8) + b"%08d" % i for i in range(n // 12)], b"\x00")
    out.append(Attack("ttheader", "unframed list<string>", [(0, data, cuts)]))
    head = _thrift_call(1, 9) + b"\x0d\x00\x01\x08\x0b" + _be(4, n // 14)
    data, cuts = _joined(head, [_be(4, i) + _be(4, 6) + b"%06d" % i
                                for i in range(n // 14)], b"\x00")
    out.append(Attack("ttheader", "unframed map<i32,string>", [(0, data, cuts)]))
    depth = 60                                  # deep nesting, many times over
    one = b"\x0c\x00\x01" * depth + b"\x02\x00\x02\x01" + b"\x00" * (depth + 1)
    k = n // len(one)
    head = _thrift_call(1, 10) + b"\x0f\x00\x01\x0c" + _be(4, k)
    parts = []
    for _ in range(k):
        parts.extend([b"\x0c\x00\x01"] * depth + [b"\x02\x00\x02\x01"] + [b"\x00"] * (depth + 1))
    data, cuts = _joined(head, parts, b"\x00")
    out.append(Attack("ttheader", "unframed deep nesting x%d" % k, [(0, data, cuts)]))
    # framed EXCEPTIONs: walked up to the type field (2), behind a big info section
    infos = bytearray(b"\x00\x00\x01") + _uvar(min(n, 40_000) // 20)
    for i in range(min(n, 40_000) // 20):
        infos += _uvar(8) + b"key%05d" % i + _uvar(8) + b"val%05d" % i
    infos += b"\x00" * (-len(infos) % 4)
    room = limit - len(infos) - 64
    fields = [b"\x08\x00\x01" + _be(4, i) for i in range(max(4, min(n, room) // 7))]
    msg, cuts = _joined(_thrift_call(3, 11), fields, b"\x08\x00\x02" + _be(4, 6) + b"\x00")
    hdr = _be(2, 0x0FFF) + b"\x00\x00" + _be(4, 11) + _be(2, len(infos) // 4) + bytes(infos)
    data = _be(4, len(hdr) + len(msg)) + hdr + msg
    out.append(Attack("ttheader", "THeader EXCEPTION behind 40 KB of infos",
                      [(1, data, [4 + len(hdr) + c for c in cuts])]))
    name = b"adversary"
    cmsg = bytes([0x82, (3 << 5) | 1]) + _uvar(12) + _uvar(len(name)) + name
    fields = [b"\x05\x02" + _uvar(i & 0x3FFF) for i in range(n // 5)]
    msg, cuts = _joined(cmsg, fields, b"\x15\x0c\x00")
    kinfo = b"\x01" + _be(2, 64) + b"".join(_be(2, 6) + b"k%05d" % i + _be(2, 6) + b"v%05d" % i
                                             for i in range(64))
    kinfo = b"\x02\x00" + kinfo
    kinfo += b"\x00" * (-len(kinfo) % 4)
    hdr = _be(2, 0x1000) + b"\x00\x00" + _be(4, 12) + _be(2, len(kinfo) // 4) + kinfo
    data = _be(4, len(hdr) + len(msg)) + hdr + msg
    out.append(Attack("ttheader", "Kitex TTHeader compact EXCEPTION",
                      [(1, data, [4 + len(hdr) + c for c in cuts])]))
    if flood:
        frames = []
        for seq in flood_ids(0, flood, False, collide):
            m = _thrift_call(1, seq) + b"\x00"
            frames.append(_be(4, len(m)) + m)
        data, cuts = _joined(b"", frames)
        out.append(Attack("ttheader", "%d CALLs, colliding seq ids" % flood,
                          [(0, data, cuts)], flood=True))
    return out


# ---- RocketMQ ------------------------------------------------------------------------

def _rocket(header, body=b"", stype=0):
    return _be(4, 4 + len(header) + len(body)) + _be(4, (stype << 24) | len(header)) + \
        header + body


def rocketmq_attacks(size, flood=60_000, collide=True):
    n = max(16, min(size, 60_000))
    out = []
    entries = [b'"k%06d":"v%06d"' % (i, i) + b"," for i in range(max(2, n // 20))]
    entries[-1] = entries[-1][:-1]
    head = b'{"code":10,"extFields":{'
    hdr, cuts = _joined(head, entries, b'},"flag":0,"language":"JAVA","opaque":7,"version":1}')
    out.append(Attack("rocketmq", "JSON header, extFields of %d entries" % len(entries),
                      [(0, _rocket(hdr), [8 + c for c in cuts])]))
    entries = [b'"k%06d":[1,{"a":"\\"x\\""}],' % i for i in range(n // 26)]
    hdr, cuts = _joined(b'{', entries, b'"code":10,"flag":0,"opaque":8}')
    out.append(Attack("rocketmq", "JSON header, %d top-level keys" % len(entries),
                      [(0, _rocket(hdr), [8 + c for c in cuts])]))
    nest = min(n // 2, 30_000)                  # nesting json.loads must refuse
    hdr = b'{"code":10,"opaque":9,"x":' + b"[" * nest + b"]" * nest + b"}"
    out.append(Attack("rocketmq", "JSON header nested %d deep" % nest,
                      [(0, _rocket(hdr), list(range(8 + 26, 8 + 26 + 2 * nest, 16)))]))
    ext = [_be(2, 7) + b"k%06d" % i + _be(4, 7) + b"v%06d" % i for i in range(n // 20)]
    ext_b, cuts = _joined(b"", ext)
    hdr = _be(2, 10) + b"\x00" + _be(2, 1) + _be(4, 10) + _be(4, 0) + _be(4, 0) + \
        _be(4, len(ext_b)) + ext_b
    out.append(Attack("rocketmq", "binary header, %d extFields" % len(ext),
                      [(0, _rocket(hdr, stype=1), [8 + 21 + c for c in cuts])]))
    hdr = b'{"code":320,"flag":0,"opaque":11}'
    msgs = [_be(4, 12) + _be(8, i) for i in range(n // 12)]
    body, cuts = _joined(b"", msgs)
    out.append(Attack("rocketmq", "SEND_BATCH_MESSAGE of %d messages" % len(msgs),
                      [(0, _rocket(hdr, body), [8 + len(hdr) + c for c in cuts])]))
    # a route answer captured for address rewriting (the whole frame is held)
    brokers = [b'{"brokerName":"b%05d","brokerAddrs":{0:"10.0.0.1:10911"}},' % i
               for i in range(n // 60)]
    body, cuts = _joined(b'{"brokerDatas":[', brokers, b'{}]}')
    req = _rocket(b'{"code":105,"flag":0,"opaque":12,"extFields":{"topic":"t"}}')
    resp_hdr = b'{"code":0,"flag":1,"opaque":12}'
    resp = _rocket(resp_hdr, body)
    out.append(Attack("rocketmq", "route answer of %d brokers, rewritten" % len(brokers),
                      [(0, req, []), (1, resp, [8 + len(resp_hdr) + c for c in cuts])],
                      {"advertise": {"10.0.0.1:10911": "127.0.0.1:20911"}}))
    if flood:
        frames = [_rocket(b'{"code":10,"flag":0,"opaque":%d}' % k)
                  for k in flood_ids(0, flood, False, collide)]
        data, cuts = _joined(b"", frames)
        out.append(Attack("rocketmq", "%d requests, colliding opaques" % flood,
                          [(0, data, cuts)], flood=True))
    return out


# ---- fleximq -------------------------------------------------------------------------

def _mp_str(s):
    s = s if isinstance(s, bytes) else s.encode()
    if len(s) < 32:
        return bytes([0xA0 | len(s)]) + s
    return b"\xda" + _be(2, len(s)) + s


def _flexi(mtype, header, payload=b"", cid=1000):
    return bytes([1, mtype]) + _be(4, cid) + bytes(16) + _be(4, len(header)) + \
        _be(8, len(payload)) + header + payload


def fleximq_attacks(size, flood=60_000, collide=True):
    n = max(16, min(size, 60_000))
    out = []
    k = n // 16
    entries = [b"\x81" + _mp_str("client_id") + b"\xce" + _be(4, i) for i in range(k)]
    head = b"\x82" + _mp_str("reqrep") + b"\x82" + _mp_str("type") + _mp_str("request") + \
        _mp_str("id") + _mp_str("r1") + _mp_str("routing") + b"\xdd" + _be(4, k)
    hdr, cuts = _joined(head, entries)
    out.append(Attack("fleximq", "NOTIF header routing %d targets" % k,
                      [(0, _flexi(3, hdr), [34 + c for c in cuts])]))
    k = n // 12
    entries = [_mp_str(b"x%07d" % i) + b"\x91\xc0" for i in range(k)]
    head = b"\xdf" + _be(4, k + 1) + _mp_str("topic") + _mp_str("t")
    hdr, cuts = _joined(head, entries)
    out.append(Attack("fleximq", "PUB header of %d unknown keys" % k,
                      [(0, _flexi(5, hdr), [34 + c for c in cuts])]))
    depth = 40                                  # deeper than the scanner follows
    one = b"\x81\xa1a" * depth + b"\xc0"
    k = n // len(one)
    head = b"\x82" + _mp_str("topic") + _mp_str("t") + _mp_str("auth") + b"\xde" + _be(2, k)
    parts = [_mp_str(b"k%05d" % i) + one for i in range(k)]
    hdr, cuts = _joined(head, parts)
    out.append(Attack("fleximq", "SUB header, auth of %d maps %d deep" % (k, depth),
                      [(0, _flexi(6, hdr), [34 + c for c in cuts])]))
    if flood:
        frames = [_flexi(8, b"\x81" + _mp_str("keepalive") + b"\x81" + _mp_str("timestamp") +
                         b"\xcf" + _be(8, ts)) for ts in flood_ids(4, flood, True, collide)]
        data, cuts = _joined(b"", frames)
        out.append(Attack("fleximq", "%d PINGs, colliding timestamps" % flood,
                          [(0, data, cuts)], flood=True))
    return out


# ---- FlyMQ (FIFO correlation: no ids to collide) ------------------------------------

def flymq_attacks(size, flood=0, collide=True):
    n = max(16, size)
    out = []
    frames = [b"\xaf\x01\x01\x00" + _be(4, 2 + 5 + 4) + _be(2, 5) + b"topic" + _be(4, i)
              for i in range(n // 19)]
    data, cuts = _joined(b"", frames)
    out.append(Attack("flymq", "%d PRODUCE frames" % len(frames), [(0, data, cuts)]))
    frames = [b"\xaf\x01\x07\x00" + _be(4, 12) + _be(4, 1) + _be(8, i) for i in range(n // 20)]
    data, cuts = _joined(b"", frames)
    reqs = b"".join(b"\xaf\x01\x07\x00" + _be(4, 2) + _be(2, 0) for _ in frames)
    out.append(Attack("flymq", "%d FETCH answers" % len(frames),
                      [(0, reqs, []), (1, data, cuts)]))
    return out


# ---- RabbitMQ Stream -----------------------------------------------------------------

def _stream(key, body, version=1):
    return _be(4, 4 + len(body)) + _be(2, key) + _be(2, version) + body


def _sstr(s):
    return _be(2, len(s)) + s


def rabbitmq_stream_attacks(size, flood=60_000, collide=True):
    n = max(16, size)
    out = []
    k = n // 17
    msgs = [_be(8, i) + _be(4, 5) + b"hello" for i in range(k)]
    body, cuts = _joined(b"\x01" + _be(4, k), msgs)
    pub = _stream(2, body)
    out.append(Attack("rabbitmq-stream", "Publish of %d messages" % k,
                      [(0, pub, [8 + c for c in cuts])]))
    ids = [_be(8, i) for i in range(k)]
    body, cuts = _joined(b"\x01" + _be(4, k), ids)
    out.append(Attack("rabbitmq-stream", "PublishConfirm of %d ids" % k,
                      [(0, pub, []), (1, _stream(3, body), [8 + c for c in cuts])]))
    # sub-entry batches (type 0x80 | gzip << 4, Count, Uncompressed, Size, data) between
    # simple messages, v1 and v2 (filter value before each entry)
    for version in (1, 2):
        fv = _sstr(b"f") if version >= 2 else b""
        k = n // (30 + len(fv))
        msgs = [_be(8, i) + fv + (_be(1, 0x90) + _be(2, 3) + _be(4, 12) + _be(4, 5) + b"batch"
                                  if i % 2 else _be(4, 5) + b"hello") for i in range(k)]
        body, cuts = _joined(b"\x01" + _be(4, k), msgs)
        out.append(Attack("rabbitmq-stream", "Publish v%d of %d simple messages and "
                          "sub-entry batches" % (version, k),
                          [(0, _stream(2, body, version), [8 + c for c in cuts])]))
    k = n // 40
    brokers = [_be(2, i) + _sstr(b"rabbit-%05d" % i) + _be(4, 5552) for i in range(k)]
    streams = [_sstr(b"stream-%05d" % i) + _be(2, 1) + _be(2, i) + _be(4, 1) + _be(2, i)
               for i in range(k)]
    b1, c1 = _joined(_be(4, 21) + _be(4, k), brokers)
    b2, c2 = _joined(_be(4, k), streams)
    req = _stream(15, _be(4, 21) + _be(4, 1) + _sstr(b"s"))
    resp = _stream(15 | 0x8000, b1 + b2)
    out.append(Attack("rabbitmq-stream", "Metadata answer of %d brokers, rewritten" % k,
                      [(0, req, []), (1, resp, [8 + c for c in c1] +
                                     [8 + len(b1) + c for c in c2])]))
    if flood:
        msgs = [_be(8, pid) + _be(4, 1) + b"x" for pid in flood_ids(256 + 1, flood, True, collide)]
        body, cuts = _joined(b"\x01" + _be(4, flood), msgs)
        out.append(Attack("rabbitmq-stream", "Publish of %d colliding publishing ids" % flood,
                          [(0, _stream(2, body), [8 + c for c in cuts])], flood=True))
        frames = [_stream(11, _be(4, corr) + _sstr(b"ref") + _sstr(b"s"))
                  for corr in flood_ids(0, flood, False, collide)]
        data, cuts = _joined(b"", frames)
        out.append(Attack("rabbitmq-stream", "%d QueryOffset, colliding correlation ids"
                          % flood, [(0, data, cuts)], flood=True))
    return out


GENERATORS = {"ttheader": ttheader_attacks, "rocketmq": rocketmq_attacks,
              "fleximq": fleximq_attacks, "flymq": flymq_attacks,
              "rabbitmq-stream": rabbitmq_stream_attacks}


def attacks(name, size, flood=60_000, collide=True):
    """The adversarial inputs of protocol `name`: structures of about `size` bytes and,
    unless flood is 0, `flood` requests with colliding correlation ids (with `collide`
    false: the same requests with random ids, the baseline a flood is measured against)."""
    return GENERATORS[name](size, flood, collide)


def attack_reads(attack, mode):
    """The reads of an attack: "whole" (each step in one read), "elements" (cut at every
    element boundary), "bytes" (one byte a read) or "slices" (64 KiB, as the relay)."""
    out = []
    for d, data, cuts in attack.steps:
        if mode == "whole":
            pts = []
        elif mode == "elements":
            pts = [c for c in cuts if 0 < c < len(data)]
        elif mode == "bytes":
            pts = range(1, len(data))
        else:
            pts = range(65536, len(data), 65536)
        k = 0
        for c in pts:
            if c > k:
                out.append((d, data[k:c]))
                k = c
        out.append((d, data[k:]))
    return out


@contextlib.contextmanager
def collector_off():
    """The cyclic garbage collector off while a parser is timed: a full collection's
    pause depends on what else the process holds (in a test session, tens of ms), not on
    the input, and lands in whichever run crosses its threshold."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def timed_run(stats_cls, parser_cls, name, reads, options=None, limits=None, budget=None,
              trace=True):
    """Feed `reads` to a fresh parser (with `trace`, recording, so the frame-log paths run
    too), close it; returns (CPU seconds of this thread, counters, returns, error).  With
    `budget` (seconds) the feeding stops once it is spent (returns None for the
    counters): a super-linear case fails fast instead of running for minutes.  The
    cyclic garbage collector is off meanwhile (its pauses are not the parser's)."""
    with collector_off():
        return _timed_run(stats_cls, parser_cls, name, reads, options, limits, budget, trace)


def flood_cost(stats_cls, parser_cls, name, chosen, randoms, options=None, first=None,
               rounds=FLOOD_ROUNDS):
    """A flood's reads (`chosen`: colliding ids) against the same requests with random
    ids, `rounds` interleaved runs of each (`first`: a chosen run already timed): returns
    (the fastest chosen run, the fastest random run, whether it is within FLOOD_RATIO x
    random + FLOOD_SLACK).  The fastest of each, since a noisy machine only adds time."""
    c = [] if first is None else [first]
    r = []
    while len(c) < rounds or len(r) < rounds:
        if len(r) < rounds:
            r.append(timed_run(stats_cls, parser_cls, name, randoms, options, trace=False)[0])
        if len(c) < rounds:
            c.append(timed_run(stats_cls, parser_cls, name, chosen, options, trace=False)[0])
    return min(c), min(r), min(c) <= FLOOD_RATIO * min(r) + FLOOD_SLACK


def _timed_run(stats_cls, parser_cls, name, reads, options, limits, budget, trace):
    stats = stats_cls("fuzz", name)
    p = parser_cls(stats, None, 30.0, dict(options or {}))
    if limits:
        p.fifo_limit, p.map_limit = limits
    if trace:
        p.tracer = _drop
    returns = []
    t0 = time.thread_time()
    for k, (d, piece) in enumerate(reads):
        returns.append(p.feed(d, piece))
        if p.error is not None:
            break
        if budget is not None and not k & 63 and time.thread_time() - t0 > budget:
            return time.thread_time() - t0, None, returns, "over budget"
    p.close()
    secs = time.thread_time() - t0
    s = stats.snapshot()
    counters = {k: s[k] for k in ("frames", "frame_bytes", "messages", "responses",
                                  "timeouts", "unmatched", "in_flight", "errors", "bytes")}
    counters["hist"] = {k: sum(v[0]) for k, v in s["hist"].items()}
    err = p.error
    return secs, counters, returns, None if err is None else (err.reason, err.direction,
                                                              err.offset)


def _drop(record):
    pass


def small_frame(name, i):
    """A small request of protocol `name` (correlation id i + 1): many of them, one a
    read, are the baseline for what a read costs by itself."""
    i += 1
    if name == "ttheader":
        m = _thrift_call(1, i) + b"\x00"
        return _be(4, len(m)) + m
    if name == "rocketmq":
        return _rocket(b'{"code":10,"flag":0,"opaque":%d}' % i)
    if name == "fleximq":
        return _flexi(8, b"\x81" + _mp_str("keepalive") + b"\x81" + _mp_str("timestamp") +
                      b"\xcf" + _be(8, i))
    if name == "flymq":
        return b"\xaf\x01\x01\x00" + _be(4, 7) + _be(2, 5) + b"topic"
    return _stream(11, _be(4, i) + _sstr(b"ref") + _sstr(b"s"))   # QueryOffset


def _twins(name):
    from proxy import framing_py, protocols
    from proxy import _framing
    spec = protocols.load(name)
    return {"c": (_framing.RouteStats, spec.load_parser(pure_python=False)),
            "py": (framing_py.RouteStats, spec.load_parser(pure_python=True))}


class _Progress:
    """A line on `out` at most every PROGRESS_SECONDS (long runs show they are alive)."""

    def __init__(self, out, label):
        self.out, self.label = out, label
        self.started = self.last = time.monotonic()

    def __call__(self, text):
        now = time.monotonic()
        if now - self.last >= PROGRESS_SECONDS:
            self.last = now
            print(f"  {self.label}: {text}, {now - self.started:.0f} s", file=self.out,
                  flush=True)


def fuzz(name: str, frames: int, seed: int, out=sys.stdout) -> dict:
    """Mutated frames through both twins: exceptions, disagreements and cases over the
    time budget (each case timed in each twin)."""
    twins = _twins(name)
    spec = __import__("proxy.protocols", fromlist=["load"]).load(name)
    corpus = _corpus(spec)
    rng = random.Random(seed)
    fed = cases = raised = differ = slow = 0
    worst = (0.0, "")                          # highest share of the budget used
    progress = _Progress(out, name)
    started = time.perf_counter()
    while fed < frames:
        picks = [rng.choice(corpus) for _ in range(rng.randrange(1, 9))]
        steps = [(d, _mutate(rng, f) if rng.random() < 0.5 else f) for d, f in picks]
        if rng.random() < 0.1:
            steps.append(rng.choice(steps))
        reads = []
        for d, f in steps:
            reads.extend((d, piece) for piece in _splits(rng, f))
        limits = rng.choice((None, None, (3, 3), (1, 2)))
        nbytes = sum(len(p) for _, p in reads)
        results = []
        for twin, (stats_cls, parser_cls) in twins.items():
            try:
                secs, counters, returns, err = timed_run(stats_cls, parser_cls, name, reads,
                                                         limits=limits, trace=False)
            except Exception as exc:           # an escaping exception is a defect
                raised += 1
                results.append(("raised", type(exc).__name__, str(exc)))
                continue
            results.append((counters, returns, err))
            share = secs / budget_seconds(twin, nbytes, len(reads))
            if share > 1:                      # once more: a one-off stall is not the case's
                secs = min(secs, timed_run(stats_cls, parser_cls, name, reads, limits=limits,
                                           trace=False)[0])
                share = secs / budget_seconds(twin, nbytes, len(reads))
            if share > worst[0]:
                worst = (share, f"{twin} {secs * 1e3:.1f} ms for {nbytes} B in "
                                f"{len(reads)} reads")
            if share > 1:
                slow += 1
                if slow <= 3:
                    print(f"  {name}: case {cases} took {secs * 1e3:.1f} ms in the {twin} "
                          f"twin, over its budget of "
                          f"{budget_seconds(twin, nbytes, len(reads)) * 1e3:.1f} ms: "
                          f"{[(d, f.hex()) for d, f in steps]}", file=out)
        if results[0] != results[1]:
            differ += 1
            if differ <= 3:
                print(f"  {name}: twins differ on case {cases}: "
                      f"{[(d, f.hex()) for d, f in steps]}", file=out)
        fed += len(steps)
        cases += 1
        if not cases & 255:
            progress(f"{fed:,} / {frames:,} frames")
    secs = time.perf_counter() - started
    return {"protocol": name, "frames": fed, "cases": cases, "raised": raised,
            "differ": differ, "slow": slow, "worst": worst, "seconds": round(secs, 1)}


def adversarial(name: str, size: int = 100_000, flood: int = 60_000,
                bytes_max: int = 20_000, out=sys.stdout) -> dict:
    """The protocol's adversarial inputs through both twins (module docstring): returns
    counts of runs over the budget (slow), twin or cut disagreements (differ) and
    exceptions (raised), and the floods over the budget or costlier than FLOOD_RATIO x
    the same requests with random ids (flood_slow: their names)."""
    twins = _twins(name)
    res = {"protocol": name, "attacks": 0, "slow": 0, "differ": 0, "raised": 0,
           "flood_slow": [], "lines": []}
    baseline = {}
    if flood:
        for a in attacks(name, 1000, flood, collide=False):
            if a.flood:
                baseline[a.name] = a
    runs = [(a, ["slices"] if a.flood else ["whole", "elements"])
            for a in attacks(name, size, flood)]
    if bytes_max:                              # smaller ones, also one byte a read
        runs += [(a, ["whole", "bytes"]) for a in attacks(name, bytes_max, 0)]
    for a, modes in runs:
        res["attacks"] += 1
        nbytes = sum(len(s[1]) for s in a.steps)
        line = f"{name:16s} {a.name[:46]:46s} {nbytes:>9,} B"
        seen = {}
        marked = False
        for mode in modes:
            reads = attack_reads(a, mode)
            for twin, (stats_cls, parser_cls) in twins.items():
                budget = budget_seconds(twin, nbytes, len(reads))
                try:
                    secs, counters, returns, err = timed_run(
                        stats_cls, parser_cls, name, reads, a.options, budget=4 * budget,
                        trace=not a.flood)
                    if budget < secs < 4 * budget:      # once more: a one-off stall?
                        secs = min(secs, timed_run(stats_cls, parser_cls, name, reads,
                                                   a.options, trace=not a.flood)[0])
                except Exception as exc:
                    res["raised"] += 1
                    print(f"  {name}: {a.name} ({mode}, {twin}) raised {exc!r}", file=out)
                    continue
                mark = ""
                if secs > budget:
                    if a.flood:
                        if a.name not in res["flood_slow"]:
                            res["flood_slow"].append(a.name)
                    else:
                        res["slow"] += 1
                    mark = ">" if counters is None else "!"
                    marked = True
                line += f" | {twin} {mode[:5]:5s} {secs * 1e9 / nbytes:8.1f}{mark or ' '}"
                if counters is None:
                    continue
                key = (counters, err)
                if seen.setdefault("all", key) != key:
                    res["differ"] += 1
                    print(f"  {name}: {a.name}: {twin} twin, {mode}: counters or error "
                          f"differ from the first run: {key} vs {seen['all']}", file=out)
                if a.flood and a.name in baseline:
                    base = attack_reads(baseline[a.name], mode)
                    csecs, rsecs, ok = flood_cost(stats_cls, parser_cls, name, reads, base,
                                                  a.options, first=secs)
                    line += (f" (random ids {rsecs * 1e9 / nbytes:.1f}, "
                             f"x{csecs / max(rsecs, 1e-9):.2f}{'' if ok else ' FLOOD'})")
                    if not ok and a.name not in res["flood_slow"]:
                        res["flood_slow"].append(a.name)
        line += " ns/B" + ("  (! over budget, > stopped at 4x budget)" if marked else "")
        res["lines"].append(line)
        print(line, file=out, flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Budgets (CPU time a case, per twin): compiled 0.25 us/B + 2 us/read + "
               "20 ms, pure Python 10 us/B + 50 us/read + 50 ms; floods: at most "
               f"{FLOOD_RATIO:g}x the same requests with random ids (+ "
               f"{FLOOD_SLACK * 1e3:g} ms), the fastest of {FLOOD_ROUNDS} runs each.")
    ap.add_argument("--protocol", default="all")
    ap.add_argument("--frames", type=int, default=10_000_000,
                    help="mutated frames per protocol (default 10,000,000; 0: none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--size", type=int, default=100_000,
                    help="bytes of each adversarial structure (default 100,000)")
    ap.add_argument("--flood", type=int, default=60_000,
                    help="requests with colliding correlation ids per flood (default "
                         "60,000; 0: no floods)")
    ap.add_argument("--bytes-max", type=int, default=20_000,
                    help="bytes of each adversarial structure also fed one byte a read "
                         "(default 20,000; 0: none)")
    ap.add_argument("--no-adversarial", action="store_true",
                    help="only the mutated frames")
    args = ap.parse_args(argv)
    from proxy import protocols
    names = [s.name for s in protocols.specs()] if args.protocol == "all" else [args.protocol]
    bad = floods = 0
    for name in names:
        if args.frames > 0:
            r = fuzz(name, args.frames, args.seed)
            print(f"{r['protocol']:16s} {r['frames']:>11,} frames in {r['cases']:,} cases, "
                  f"{r['seconds']} s: {r['raised']} exceptions, {r['differ']} twin "
                  f"disagreements, {r['slow']} over the time budget (most: "
                  f"{r['worst'][0]:.0%} of it, {r['worst'][1]})", flush=True)
            bad += r["raised"] + r["differ"] + r["slow"]
        if not args.no_adversarial:
            a = adversarial(name, args.size, args.flood, args.bytes_max)
            print(f"{name:16s} {a['attacks']} adversarial inputs: {a['raised']} exceptions, "
                  f"{a['differ']} disagreements, {a['slow']} runs over the time budget, "
                  f"{len(a['flood_slow'])} floods over the budget or {FLOOD_RATIO:g}x "
                  "random ids", flush=True)
            bad += a["raised"] + a["differ"] + a["slow"]
            floods += len(a["flood_slow"])
    if floods:
        print(f"FAIL: {floods} floods of ids that collide under the unkeyed hash cost more "
              f"than the budget or {FLOOD_RATIO:g}x the same requests with random ids: is "
              "the compiled pending map's hash (_mix in proxy/_pending.pxd) still keyed "
              "by a secret seed? (issue 19)", flush=True)
    return 1 if bad or floods else 0


if __name__ == "__main__":
    sys.exit(main())
