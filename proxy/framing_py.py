"""Pure-Python twin of the compiled framing core (proxy/_framing.pyx).

Same behaviour, same API; used with FRAMETAP_NO_EXTENSIONS=1 and as the baseline
of the parser benchmarks.  Keep the two in step: the parser tests run on both.
"""

import time

from proxy.errors import frame_error_class
from proxy.framing_common import (BUCKETS_NS, DIRECTIONS, REASONS, OUTCOMES,
                                  OPCODE_SLOTS, OTHER_SLOT, STATUS_SLOTS,
                                  DEFAULT_FIFO_LIMIT, DEFAULT_MAP_LIMIT, R_OVERFLOW,
                                  R_TRUNCATED, C2S)

N_BUCKETS = len(BUCKETS_NS)
CODE_TABLE = 65536
monotonic_ns = time.monotonic_ns
now_ns = monotonic_ns


def bucket_of(dt_ns):
    i = 0
    for bound in BUCKETS_NS:
        if dt_ns <= bound:
            return i
        i += 1
    return i


class RouteStats:
    """Every counter of one route (pure-Python twin)."""

    def __init__(self, route="route", protocol="unknown", opcode_namer=None,
                 status_namer=None):
        self.route = str(route)
        self.protocol = str(protocol)
        self.opcode_namer = opcode_namer
        self.status_namer = status_namer
        self.slot_of = {}
        self.slot_code = []
        self.status_code = []
        self.frames = [[0] * OPCODE_SLOTS for _ in range(2)]
        self.frame_bytes = [[0] * OPCODE_SLOTS for _ in range(2)]
        self.messages = [[0] * OPCODE_SLOTS for _ in range(2)]
        self.relayed = [0, 0]
        self.responses = {}                      # (slot, status slot) -> n
        self.hist = {}                           # (slot, outcome) -> [counts, sum]
        self.timeouts = [0] * OPCODE_SLOTS
        self.unmatched = 0
        self.in_flight = 0
        self.errors = [[0] * len(REASONS) for _ in range(2)]
        self.conn_active = 0
        self.conn_total = 0
        self.conn_rejected = 0
        self.connect_failures = 0
        self.connect_hist = [0] * (N_BUCKETS + 1)
        self.connect_sum = 0.0

    def slot_for(self, code):
        s = self.slot_of.get(code)
        if s is not None:
            return s
        if code < 0 or code >= CODE_TABLE or len(self.slot_code) >= OTHER_SLOT:
            s = OTHER_SLOT
        else:
            s = len(self.slot_code)
            self.slot_code.append(code)
        self.slot_of[code] = s
        return s

    opcode_slot = slot_for

    def status_slot(self, code):
        try:
            return self.status_code.index(code)
        except ValueError:
            if len(self.status_code) < STATUS_SLOTS - 1:
                self.status_code.append(code)
                return len(self.status_code) - 1
            return STATUS_SLOTS - 1

    def observe(self, slot, outcome, dt_ns):
        if dt_ns < 0:
            dt_ns = 0
        h = self.hist.get((slot, outcome))
        if h is None:
            h = self.hist[(slot, outcome)] = [[0] * (N_BUCKETS + 1), 0.0]
        h[0][bucket_of(dt_ns)] += 1
        h[1] += dt_ns * 1e-9

    def response(self, slot, status):
        key = (slot, self.status_slot(status))
        self.responses[key] = self.responses.get(key, 0) + 1

    def error(self, direction, reason):
        self.errors[direction][reason] += 1

    def count_bytes(self, direction, n):
        self.relayed[direction] += n

    def observe_connect(self, seconds):
        self.connect_hist[bucket_of(int(seconds * 1e9))] += 1
        self.connect_sum += seconds

    def count_error(self, direction, reason):
        self.error(DIRECTIONS.index(direction), REASONS.index(reason))

    def snapshot(self):
        opname = self.opcode_namer or (lambda c: "unknown_%d" % c)
        stname = self.status_namer or str
        names = [opname(c) for c in self.slot_code]
        names.extend(["other"] * (OPCODE_SLOTS - len(names)))
        statuses = [stname(c) for c in self.status_code]
        statuses.extend(["other"] * (STATUS_SLOTS - len(statuses)))
        frames, fbytes, msgs, responses, hist, timeouts, errors = {}, {}, {}, {}, {}, {}, {}
        for d in range(2):
            for s in range(OPCODE_SLOTS):
                key = (DIRECTIONS[d], names[s])
                if self.frames[d][s]:
                    frames[key] = frames.get(key, 0) + self.frames[d][s]
                    fbytes[key] = fbytes.get(key, 0) + self.frame_bytes[d][s]
                if self.messages[d][s]:
                    msgs[key] = msgs.get(key, 0) + self.messages[d][s]
            for r, v in enumerate(self.errors[d]):
                if v:
                    errors[(DIRECTIONS[d], REASONS[r])] = v
        for (s, r), v in self.responses.items():
            key = (names[s], statuses[r])
            responses[key] = responses.get(key, 0) + v
        for (s, o), (counts, total) in self.hist.items():
            hist[(names[s], OUTCOMES[o])] = (list(counts), total)
        for s, v in enumerate(self.timeouts):
            if v:
                timeouts[names[s]] = timeouts.get(names[s], 0) + v
        return {
            "route": self.route, "protocol": self.protocol,
            "frames": frames, "frame_bytes": fbytes, "messages": msgs,
            "bytes": {DIRECTIONS[0]: self.relayed[0], DIRECTIONS[1]: self.relayed[1]},
            "responses": responses, "hist": hist, "timeouts": timeouts,
            "unmatched": self.unmatched, "in_flight": self.in_flight, "errors": errors,
            "conn_active": self.conn_active, "conn_total": self.conn_total,
            "conn_rejected": self.conn_rejected,
            "connect_failures": self.connect_failures,
            "connect_hist": (list(self.connect_hist), self.connect_sum),
        }


class _Dir:
    __slots__ = ("remaining", "frame_start", "offset", "hdr", "need", "body", "capture")

    def __init__(self, need):
        self.remaining = 0
        self.frame_start = 0
        self.offset = 0
        self.hdr = bytearray()
        self.need = need
        self.body = False
        self.capture = False


class Pending:
    __slots__ = ("t_ns", "key", "slot", "expired")

    def __init__(self, t_ns, key, slot):
        self.t_ns = t_ns
        self.key = key
        self.slot = slot
        self.expired = False


class FrameParser:
    """Pure-Python twin of _framing.FrameParser; protocols override on_header()."""

    header_size = 0
    max_frame_bytes = 0

    def __init__(self, stats, max_frame_bytes=None, request_timeout=30.0, options=None):
        self.stats = stats
        if max_frame_bytes is not None:
            self.max_frame_bytes = max_frame_bytes
        self.timeout_ns = int(request_timeout * 1e9)
        self.options = options or {}
        self.st = (_Dir(self.header_size), _Dir(self.header_size))
        self.fifo = []          # list used as a queue; head index avoids O(n) pops
        self.fifo_head = 0
        self.fifo_limit = DEFAULT_FIFO_LIMIT
        self.map = {}           # (tag, key) -> Pending
        self.map_limit = DEFAULT_MAP_LIMIT
        self.hold = [False, False]
        self.captured = [None, None]
        self.output = None
        self.now_ns = 0
        self.error = None
        self.closed = False

    def set_hold(self, d, on):
        self.hold[d] = bool(on)

    def feed(self, direction, data):
        if direction not in (0, 1):
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        hold = self.hold[direction]
        out = [] if hold else None
        self.output = out
        if self.error is not None or self.closed:
            return 0
        s = self.st[direction]
        d = direction
        mv = memoryview(data).cast("B")
        n = len(mv)
        chunk_start = s.offset
        s.offset += n
        self.now_ns = monotonic_ns()
        self.stats.relayed[d] += n
        pos = 0
        emit = 0                 # start of this read's bytes not yet placed in ``out``
        held = len(s.hdr) if hold else 0
        while pos < n:
            if s.remaining > 0:
                take = min(n - pos, s.remaining)
                if s.capture:
                    self.captured[d] += mv[pos:pos + take]
                    emit = pos + take
                elif s.body:
                    self.on_body(d, mv[pos:pos + take])
                s.remaining -= take
                pos += take
                if s.remaining == 0:
                    self._frame_done(d, out)
                continue
            if not s.hdr:
                s.frame_start = chunk_start + pos
                if n - pos >= s.need:
                    r = self.on_header(d, mv[pos:], n - pos)
                    if r > 0:
                        hs = s.need
                        s.need = self.header_size
                        if s.capture:
                            if emit < pos:
                                out.append(bytes(mv[emit:pos]))
                            take = min(r, n - pos)
                            self.captured[d] = bytearray(mv[pos:pos + take])
                            s.remaining = r - take
                            pos += take
                            emit = pos
                            if s.remaining == 0:
                                self._frame_done(d, out)
                        elif s.body:
                            pos += hs
                            s.remaining = r - hs
                            if s.remaining == 0:
                                self._frame_done(d, out)
                        elif r <= n - pos:
                            pos += r
                        else:
                            s.remaining = r - (n - pos)
                            pos = n
                        continue
                    if r == 0:
                        continue
                    if out is not None and emit < pos:
                        out.append(bytes(mv[emit:pos]))
                    return pos
            take = min(s.need - len(s.hdr), n - pos)
            s.hdr += mv[pos:pos + take]
            pos += take
            if len(s.hdr) < s.need:
                if hold:         # withhold an incomplete header: it may start a capture
                    hs = max(0, s.frame_start - chunk_start)
                    if emit < hs:
                        out.append(bytes(mv[emit:hs]))
                    emit = n
                break
            have = len(s.hdr)
            r = self.on_header(d, s.hdr, have)
            if r > 0:
                if hold:
                    hs = s.frame_start - chunk_start
                    if s.capture:
                        if hs > emit:
                            out.append(bytes(mv[emit:hs]))
                        self.captured[d] = bytearray(s.hdr)
                        emit = pos
                    elif held:
                        out.append(bytes(s.hdr[:held]))
                    held = 0
                s.remaining = r - have
                s.hdr = bytearray()
                s.need = self.header_size
                if s.remaining == 0 and (s.capture or s.body):
                    self._frame_done(d, out)
            elif r < 0:
                take = max(0, s.frame_start - chunk_start)
                if out is not None and emit < take:
                    out.append(bytes(mv[emit:take]))
                return take
        if out is not None and emit < n:
            out.append(bytes(mv[emit:n]))
        return n

    def _frame_done(self, d, out):
        s = self.st[d]
        if s.capture:
            s.capture = False
            frame = bytes(self.captured[d])
            self.captured[d] = None
            out.append(self.rewrite(d, frame))
        elif s.body:
            s.body = False
            self.on_body_end(d)

    def rewrite(self, d, frame):
        return frame

    def on_header(self, d, h, avail):
        raise NotImplementedError("protocol parsers override on_header")

    def on_body(self, d, chunk):
        pass

    def on_body_end(self, d):
        pass

    def fail(self, d, reason, message):
        self.stats.error(d, reason)
        self.error = frame_error_class(self.stats.protocol)(
            "%s: %s" % (self.stats.protocol, message), REASONS[reason], DIRECTIONS[d],
            self.st[d].frame_start)
        return 0

    def fifo_push(self, slot, key):
        if len(self.fifo) - self.fifo_head >= self.fifo_limit:
            p = self.fifo_pop()
            if not p.expired:
                self.stats.timeouts[p.slot] += 1
                self.stats.in_flight -= 1
            self.stats.error(C2S, R_OVERFLOW)
        self.fifo.append(Pending(self.now_ns, key, slot))
        self.stats.in_flight += 1

    def fifo_pop(self):
        if self.fifo_head >= len(self.fifo):
            return None
        p = self.fifo[self.fifo_head]
        self.fifo_head += 1
        if self.fifo_head > 1024 and self.fifo_head * 2 > len(self.fifo):
            del self.fifo[:self.fifo_head]
            self.fifo_head = 0
        return p

    def map_put(self, tag, key, slot):
        k = (tag, key)
        old = self.map.get(k)
        if old is None:
            if len(self.map) >= self.map_limit:
                self.stats.error(C2S, R_OVERFLOW)
                return
            self.stats.in_flight += 1
        elif not old.expired:
            self.stats.timeouts[old.slot] += 1
        else:
            self.stats.in_flight += 1
        self.map[k] = Pending(self.now_ns, key, slot)

    def map_take(self, tag, key):
        return self.map.pop((tag, key), None)

    def settle(self, p, outcome):
        if not p.expired:
            self.stats.observe(p.slot, outcome, self.now_ns - p.t_ns)
            self.stats.in_flight -= 1

    def _pending(self):
        yield from self.fifo[self.fifo_head:]
        yield from self.map.values()

    def expire(self, now=0):
        now = now or monotonic_ns()
        n = 0
        for p in self.fifo[self.fifo_head:]:
            if p.expired:
                continue
            if now - p.t_ns < self.timeout_ns:
                break
            p.expired = True
            self.stats.timeouts[p.slot] += 1
            self.stats.in_flight -= 1
            n += 1
        for p in self.map.values():
            if not p.expired and now - p.t_ns >= self.timeout_ns:
                p.expired = True
                self.stats.timeouts[p.slot] += 1
                self.stats.in_flight -= 1
                n += 1
        return n

    def close(self):
        if self.closed:
            return
        self.closed = True
        for p in self._pending():
            if not p.expired:
                self.stats.timeouts[p.slot] += 1
                self.stats.in_flight -= 1
        self.fifo = []
        self.fifo_head = 0
        self.map = {}
        if self.error is None:
            for d in range(2):
                if self.st[d].hdr or self.st[d].remaining > 0:
                    self.stats.error(d, R_TRUNCATED)

    @property
    def pending(self):
        return len(self.fifo) - self.fifo_head + len(self.map)
