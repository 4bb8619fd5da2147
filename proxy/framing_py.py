"""Pure-Python twin of the compiled framing core (proxy/_framing.pyx, _pending.pyx,
_framelog.pyx).

Same behaviour, same API (the calls of _framing.pxd, as Python methods); used with
FRAMETAP_NO_EXTENSIONS=1 and as the baseline of the parser benchmarks.  Keep the two
in step: the conformance suite (tests/test_conformance.py) runs every parser on both
and a fuzzer asserts they agree on every counter and record.
"""

import time

from proxy.errors import frame_error_class
from proxy.framing_common import (ATTRS_MAX, RESOURCE_MAX, CORR_TEXT_SLOTS, clip_corr, BUCKETS_NS, DIRECTIONS, REASONS,
                                  OPCODE_SLOTS, OTHER_SLOT, STATUS_SLOTS, HEADER_LIMIT,
                                  DEFAULT_FIFO_LIMIT, DEFAULT_MAP_LIMIT, R_OVERFLOW,
                                  MAP_ENTRY_BYTES, PENDING_BYTES, MAP_MIN_CAP, FIFO_MIN_CAP,
                                  UNKNOWN_LABELS,
                                  R_TRUNCATED, R_BAD_HEADER, R_HEADER_TOO_LARGE,
                                  R_PENDING_BUDGET, HBUF_KEEP, K_EVENT, K_REQUEST, OUTCOME_NONE, record_dict,
                                  route_snapshot)

N_BUCKETS = len(BUCKETS_NS)
CODE_TABLE = 65536
CORR_NONE, CORR_INT, CORR_PAIR, CORR_SINT, CORR_STR = 0, 1, 2, 3, 4
CAP_REWRITE, CAP_FAULT, CAP_UNDECIDED, CAP_NEXT = 1, 2, 4, 8   # _Dir.capture (_framing.pxd)
_U64 = (1 << 64) - 1


def ctext_index(d, slot, key, cap):
    """_framelog.pxd's _ctext_index: where a kept string id lives in a table of cap."""
    z = ((key & _U64) ^ ((slot * 2 + d) << 48)) * 0x9E3779B97F4A7C15 & _U64
    return (z >> 32) & (cap - 1)
CORR_HI_SIGNED = -2


# The process's pending-request memory (twin of _pending.pyx's): tables are accounted by
# their capacity in the compiled core's units, against [proxy] max_pending_bytes.
_pending = {"bytes": 0, "budget": 1 << 62}


def set_pending_budget(budget):
    """Twin of _pending.set_pending_budget."""
    _pending["budget"] = int(budget)


def pending_bytes():
    return _pending["bytes"]


def pending_budget():
    return _pending["budget"]


def _corr_fmt(corr_hi):
    if corr_hi >= 0:
        return CORR_PAIR
    return CORR_SINT if corr_hi == CORR_HI_SIGNED else CORR_INT
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
        self.slot_label = {}                     # slot -> interned name (bytes)
        self.known = set()                       # the protocol's opcode table (set_known)
        self.has_known = False
        self.n_unknown = 0
        self.unknown_slot = -1
        self.name_slot_of = {}
        self.status_code = []
        self.frames = [[0] * OPCODE_SLOTS for _ in range(2)]
        self.frame_bytes = [[0] * OPCODE_SLOTS for _ in range(2)]
        self.messages = [[0] * OPCODE_SLOTS for _ in range(2)]
        self.relayed = [0, 0]
        self.responses = {}                      # (slot, status slot) -> n
        self.hist = {}                           # (slot, outcome) -> [counts, sum]
        self.timeouts = [0] * OPCODE_SLOTS
        self.cutoffs = [0] * OPCODE_SLOTS
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
        if code < 0 or code >= CODE_TABLE:
            return OTHER_SLOT                   # not cached: garbage cannot grow the table
        if self.has_known and code not in self.known:
            if self.n_unknown >= UNKNOWN_LABELS:
                s = self.slot_of[code] = self._shared_unknown()
                return s
            self.n_unknown += 1
        if len(self.slot_code) >= OTHER_SLOT:
            s = OTHER_SLOT
        else:
            s = len(self.slot_code)
            self.slot_code.append(code)
        self.slot_of[code] = s
        return s

    opcode_slot = slot_for

    def _shared_unknown(self):
        if self.unknown_slot < 0:
            if len(self.slot_code) >= OTHER_SLOT:
                return OTHER_SLOT
            self.unknown_slot = len(self.slot_code)
            self.slot_code.append(-1)
            self.slot_label[self.unknown_slot] = b"unknown"
        return self.unknown_slot

    def describe(self, opcode_namer, status_namer, known_codes):
        if self.opcode_namer is None:
            self.opcode_namer = opcode_namer
        if self.status_namer is None:
            self.status_namer = status_namer
        if not self.has_known:
            self.set_known(known_codes)

    def set_known(self, codes):
        self.known.update(c for c in codes if 0 <= c < CODE_TABLE)
        self.has_known = True

    def slot_for_name(self, name):
        """Slot of an opcode known by name (bytes): interned, at most OTHER_SLOT
        distinct per route (shared with numeric codes), then OTHER_SLOT."""
        name = bytes(name)
        s = self.name_slot_of.get(name)
        if s is not None:
            return s
        if len(self.slot_code) >= OTHER_SLOT:
            return OTHER_SLOT
        s = len(self.slot_code)
        self.slot_code.append(-1)
        self.slot_label[s] = name
        self.name_slot_of[name] = s
        return s

    def name_slot(self, name):
        return self.slot_for_name(name.encode() if isinstance(name, str) else name)

    def slot_name(self, slot):
        if slot < 0 or slot >= len(self.slot_code):
            return "other"
        label = self.slot_label.get(slot)
        if label is not None:
            return label.decode("utf-8", "replace")
        return (self.opcode_namer or (lambda c: "unknown_%d" % c))(self.slot_code[slot])

    def slot_opcode(self, slot):
        if slot < 0 or slot >= len(self.slot_code):
            return -1
        return self.slot_code[slot]

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
            h = self.hist[(slot, outcome)] = [[0] * (N_BUCKETS + 1), 0]
        h[0][bucket_of(dt_ns)] += 1
        h[1] += dt_ns                          # in ns, exact: seconds at snapshot()

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
        """Copy every counter into plain Python data (read at scrape time)."""
        stname = self.status_namer or str
        return route_snapshot(
            self, [self.slot_name(s) for s in range(len(self.slot_code))],
            [stname(c) for c in self.status_code], self.frames, self.frame_bytes,
            self.messages, self.errors, sorted(self.responses.items()),
            sorted((k, (counts, ns * 1e-9)) for k, (counts, ns) in self.hist.items()),
            self.timeouts, self.cutoffs, self.relayed,
            self.unmatched, self.in_flight, self.connect_hist, self.connect_sum)


class _Dir:
    __slots__ = ("remaining", "frame_start", "offset", "hdr", "need", "skip", "gbuf",
                 "body", "capture", "open", "rows", "rec", "taken", "slot", "hcap", "mark",
                 "mark_rule", "begun")

    def __init__(self, need):
        self.remaining = 0
        self.frame_start = 0
        self.offset = 0
        self.hdr = bytearray()       # split header
        self.hcap = 0                # the compiled core's buffer size for hdr/gbuf, accounted
        self.need = need
        self.skip = 0
        self.gbuf = bytearray()      # gather()
        self.body = False
        self.capture = 0             # CAP_* bits (_framing.pxd)
        self.mark = False            # frames the fault engine injects (attrs.injected)
        self.mark_rule = None        # ... and the rule that made them (attrs.fault)
        self.begun = True            # begin() ran for the current frame (faults)
        self.open = False
        self.rows = 0
        self.rec = None
        self.taken = None
        self.slot = 0


class Pending:
    __slots__ = ("t_ns", "key", "slot", "aux", "expired", "fifo", "dir")

    def __init__(self, t_ns, key, slot, aux, fifo, d):
        self.t_ns = t_ns
        self.key = key
        self.slot = slot
        self.aux = aux
        self.expired = False
        self.fifo = fifo
        self.dir = d


class Record:
    """One frame-log row (the twin of _counters.pxd's FrameRecord)."""
    __slots__ = ("t_ns", "frame_bytes", "header_bytes", "messages", "latency_ns", "corr",
                 "status", "opcode", "corr_hi", "resource", "attrs", "slot", "req_slot",
                 "direction", "kind", "outcome", "corr_fmt", "has_status", "abytes", "cid")

    def __init__(self, t_ns, d, slot, kind, opcode, frame_bytes, header_bytes):
        self.t_ns = t_ns
        self.frame_bytes = frame_bytes
        self.header_bytes = header_bytes
        self.messages = 0
        self.latency_ns = -1
        self.corr = 0
        self.status = 0
        self.opcode = opcode
        self.corr_hi = -1
        self.resource = None     # str (set_resource)
        self.attrs = None        # {key: value} (add_attr)
        self.abytes = 0          # add_attr(): bytes used, as the compiled core counts them
        self.slot = slot
        self.req_slot = -1
        self.direction = d
        self.kind = kind
        self.outcome = OUTCOME_NONE
        self.corr_fmt = CORR_NONE
        self.has_status = False
        self.cid = None          # str (set_corr_str)


class FrameParser:
    """Pure-Python twin of _framing.FrameParser; protocols override on_header()."""

    header_size = 0
    max_frame_bytes = 0
    header_limit = HEADER_LIMIT
    frame_cap = 0            # on the class as on the compiled type: the relay looks here

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
        self.fifo_seq = 0
        self.fifo_live = 0      # sequence number of the oldest request not yet expired
        self.fifo_cap = FIFO_MIN_CAP   # the compiled core's ring size (budget accounting)
        _pending["bytes"] += FIFO_MIN_CAP * PENDING_BYTES
        self.map = {}           # (tag, key) -> Pending, live ones, in request order
        self.map_dead = {}      # expired ones, in request order (evicted first when full)
        self.map_cap = 0        # the compiled core's table size (budget accounting)
        self.ctext = None       # kept string ids: [[dir, slot, key, text, refs]] (set_corr_str)
        self.ctext_len = 0
        self.map_limit = DEFAULT_MAP_LIMIT
        self.hold = [False, False]
        self.captured = [None, None]
        self.output = None
        self.fault_mode = [0, 0]     # faults: 0 off, 1 slots in fault_slots, 2 every frame
        self.fault_slots = [frozenset(), frozenset()]
        self.fault_hold = [False, False]
        self.fault_rec = False
        self.fault_record = [True, True]
        self.fault_fifo_mark = [0, 0]
        self.fault_hook = None
        self.now_ns = 0
        self.error = None
        self.closed = False
        self.feed_frames = 0                 # headers parsed by the last feed()
        self.frame_cap = 0                   # > 0: feed() stops at a frame boundary past
                                             # frame_cap headers + messages
        self.more = False                    # the last feed() stopped there, bytes left
        self.feed_work = 0                   # messages and pending requests of the last feed()
        self.conn_id = 0
        self._tracer = None
        self._tracer_error = None
        self.recording = False
        self.log = None
        self.log_route = 0

    def set_hold(self, d, on):
        self.hold[d] = bool(on)

    # ---- hot path -------------------------------------------------------------

    def feed(self, direction, data):
        r = self._feed(direction, data)
        if self._tracer_error is not None:
            self._raise_tracer_error()
        return r

    def _raise_tracer_error(self):
        """A test's tracer raised (an assertion, say): the test fails with it, after the
        parser finished the call in a consistent state (as the compiled core does)."""
        err, self._tracer_error = self._tracer_error, None
        if err is not None:
            raise err

    def _feed(self, direction, data):
        if direction not in (0, 1):
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        d = direction
        hold = self.hold[d]
        out = [] if hold else None
        self.output = out
        if self.error is not None or self.closed:
            return 0
        s = self.st[d]
        mv = memoryview(data).cast("B")
        n = len(mv)
        chunk_start = s.offset
        s.offset += n
        self.feed_frames = 0
        self.more = False
        self.feed_work = 0
        self.now_ns = monotonic_ns()
        self.stats.relayed[d] += n
        pos = 0
        emit = 0                 # start of this read's bytes not yet placed in ``out``
        held = len(s.hdr) if hold else 0
        while pos < n:
            if s.remaining > 0:
                take = min(n - pos, s.remaining)
                if s.capture:
                    if s.capture & ~CAP_NEXT:
                        self.captured[d] += mv[pos:pos + take]
                        emit = pos + take
                    if s.body:                # a frame held for faults still streams
                        self.on_body(d, mv[pos:pos + take])
                elif s.body:
                    self.on_body(d, mv[pos:pos + take])
                s.remaining -= take
                pos += take
                if s.remaining == 0 and (s.capture or s.body or s.open):
                    self._frame_end(d, out)
                continue
            if not s.hdr:
                if self.feed_frames + self.feed_work >= self.frame_cap and self.frame_cap:
                    self.more = True                # the rest is the next feed()'s
                    s.offset -= n - pos
                    self.stats.relayed[d] -= n - pos
                    if hold and emit < pos:
                        out.append(bytes(mv[emit:pos]))
                    return pos
                s.frame_start = chunk_start + pos
                if n - pos >= s.need:
                    asked = s.need
                    r = self.on_header(d, mv[pos:], n - pos)
                    if r > 0:
                        self.feed_frames += 1
                        s.need = self.header_size
                        if r < asked or (s.body and (s.skip > n - pos or s.skip > r)):
                            self._short_frame(d, r, asked)
                            if hold and emit < pos:
                                out.append(bytes(mv[emit:pos]))
                            return pos
                        if s.capture and not (s.capture & (CAP_UNDECIDED | CAP_NEXT)
                                              and not self._fault_decide(d)
                                              and self._let_go(d, r, n - pos)):
                            if emit < pos:
                                out.append(bytes(mv[emit:pos]))
                            take = min(r, n - pos)
                            self.captured[d] = bytearray(mv[pos:pos + take])
                            if s.body and take > s.skip:   # held for faults: the body
                                self.on_body(d, mv[pos + s.skip:pos + take])
                            s.remaining = r - take
                            pos += take
                            emit = pos
                            if s.remaining == 0:
                                self._frame_end(d, out)
                        elif s.body:
                            pos += s.skip
                            s.remaining = r - s.skip
                            if s.remaining == 0:
                                self._frame_end(d, out)
                        elif r <= n - pos:
                            pos += r
                            if s.open:
                                self._frame_end(d, out)
                        else:
                            s.remaining = r - (n - pos)
                            pos = n
                        continue
                    if r == 0:
                        continue
                    if hold and emit < pos:
                        out.append(bytes(mv[emit:pos]))
                    return pos
            if s.need > self.header_limit:
                self._too_large(d, s.need)
                return self._fatal_prefix(d, chunk_start, emit, mv, out)
            if s.need > s.hcap and not self._hbuf_reserve(d, s.need):
                return self._fatal_prefix(d, chunk_start, emit, mv, out)
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
            asked = len(s.hdr)
            r = self.on_header(d, s.hdr, asked)
            if r > 0:
                self.feed_frames += 1
                if r < asked or (s.body and (s.skip > asked or s.skip > r)):
                    self._short_frame(d, r, asked)
                    return self._fatal_prefix(d, chunk_start, emit, mv, out)
                if hold:
                    if s.capture & (CAP_UNDECIDED | CAP_NEXT):
                        self._fault_decide(d)
                    hs = s.frame_start - chunk_start
                    if s.capture & ~CAP_NEXT:
                        if hs > emit:
                            out.append(bytes(mv[emit:hs]))
                        self.captured[d] = bytearray(s.hdr)
                        emit = pos
                    elif held:
                        out.append(bytes(s.hdr[:held]))
                    held = 0
                hdr = bytes(s.hdr)
                s.hdr = bytearray()
                s.need = self.header_size
                s.remaining = r - asked
                if s.body and s.skip < asked:     # (a held frame streams its body too)
                    self.on_body(d, memoryview(hdr)[s.skip:])
                if s.hcap > HBUF_KEEP:
                    self._hbuf_release(d)
                if s.remaining == 0:
                    self._frame_end(d, out)
            elif r < 0:
                return self._fatal_prefix(d, chunk_start, emit, mv, out)
        if hold and emit < n:
            if s.hdr:
                # the read ended on a split header whose on_header() asked for more
                # (want_header): it is withheld like any incomplete header
                hs = s.frame_start - chunk_start
                if hs > emit:
                    out.append(bytes(mv[emit:hs]))
            elif emit == 0 and not out and isinstance(data, bytes):
                self.output = None         # as it came: the relay writes it itself
            else:
                out.append(bytes(mv[emit:n]))
        return n

    def _fatal_prefix(self, d, chunk_start, emit, mv, out):
        take = max(0, self.st[d].frame_start - chunk_start)
        if out is not None and emit < take:
            out.append(bytes(mv[emit:take]))
        return take

    def _short_frame(self, d, r, asked):
        self.fail(d, R_BAD_HEADER, "frame of %d bytes at offset %d is shorter than the %d "
                  "header bytes its parser read, or its body skip is longer (parser "
                  "contract)" % (r, self.st[d].frame_start, asked))

    def _hbuf_reserve(self, d, n):
        """Twin of the compiled core's split-header buffer: its size (doubling from 64,
        at most header_limit) counts against the pending budget; False after fail()."""
        s = self.st[d]
        cap = s.hcap or 64
        while cap < n:
            cap *= 2
        cap = min(cap, self.header_limit)
        if _pending["bytes"] + cap - s.hcap > _pending["budget"]:
            self.fail(d, R_PENDING_BUDGET, "a header of %d bytes at offset %d does not fit "
                      "the pending-memory budget (max_pending_bytes)" % (n, s.frame_start))
            return False
        _pending["bytes"] += cap - s.hcap
        s.hcap = cap
        return True

    def _hbuf_release(self, d):
        s = self.st[d]
        if s.hcap > HBUF_KEEP and not s.gbuf and not s.hdr:
            _pending["bytes"] -= s.hcap
            s.hcap = 0

    def _too_large(self, d, n):
        self.fail(d, R_HEADER_TOO_LARGE, "a header of %d bytes at offset %d exceeds the "
                  "header limit %d" % (n, self.st[d].frame_start, self.header_limit))

    def _frame_end(self, d, out):
        s = self.st[d]
        cap = s.capture
        if s.body:
            s.body = False
            self.on_body_end(d)
        s.capture = 0
        if cap & ~CAP_NEXT:
            if cap & CAP_UNDECIDED:
                s.capture = cap
                self._fault_decide(d)
                cap = s.capture & ~(CAP_UNDECIDED | CAP_NEXT)   # never began: let go
                s.capture = 0
            frame = bytes(self.captured[d])
            self.captured[d] = None
            if cap & CAP_REWRITE:
                frame = self.rewrite(d, frame)
            if cap & CAP_FAULT and self.fault_hook is not None:
                out.append(self.fault_hook(d, frame))
            else:
                out.append(frame)
        s.gbuf = bytearray()
        if s.hcap > HBUF_KEEP:
            self._hbuf_release(d)
        if s.open:
            s.open = False
            self._emit(s.rec)
        if self.fault_mode[d] and self.hold[d]:
            self._fault_rearm(d)          # decide the next frame at its header

    def _fault_wants(self, d):
        mode = self.fault_mode[d]
        return mode == 2 or (mode == 1 and self.st[d].slot in self.fault_slots[d])

    def _fault_decide(self, d):
        s = self.st[d]
        if s.capture & CAP_NEXT:
            s.capture = (s.capture & ~CAP_NEXT) | CAP_UNDECIDED
        if not s.begun:
            return s.capture                  # not begun yet (begin() in on_body())
        s.capture &= ~CAP_UNDECIDED
        s.capture |= CAP_FAULT if self._fault_wants(d) else CAP_NEXT
        return s.capture & ~CAP_NEXT

    def _let_go(self, d, r, avail):
        """An armed frame passes: when it ends in this read and _frame_end() won't run,
        the next one is armed now (the compiled core's _capture_head)."""
        s = self.st[d]
        if not s.body and r <= avail and not s.open:
            self._fault_rearm(d)
        return True

    def _fault_rearm(self, d):
        s = self.st[d]
        s.capture = CAP_NEXT
        s.begun = False
        self.fault_fifo_mark[d] = self.fifo_seq

    # ---- faults (twin of the compiled core's; proxy/faults.py) -----------------

    def set_faults(self, d, mode, slots=(), record=True):
        if d not in (0, 1):
            raise ValueError("direction must be 0 (c2s) or 1 (s2c)")
        s = self.st[d]
        self.fault_slots[d] = frozenset(x for x in slots if 0 <= x < OPCODE_SLOTS)
        self.fault_mode[d] = mode if 0 <= mode <= 2 else 2
        self.fault_record[d] = bool(record)
        self.fault_rec = bool((self.fault_mode[0] and self.fault_record[0])
                              or (self.fault_mode[1] and self.fault_record[1]))
        self.recording = self.log is not None or self._tracer is not None or self.fault_rec
        if self.fault_mode[d]:
            if not self.hold[d]:
                if s.hdr:
                    return False
                self.hold[d] = True
                self.fault_hold[d] = True
            if not s.capture & ~CAP_NEXT:
                if s.hdr:
                    return False
                if s.remaining == 0:
                    self._fault_rearm(d)
                else:
                    s.capture = CAP_NEXT
            return True
        if s.capture & (CAP_NEXT | CAP_UNDECIDED) == s.capture and not s.hdr \
                and s.remaining == 0:
            s.capture = 0
        if self.fault_hold[d]:
            if s.capture or s.hdr:
                return False
            self.hold[d] = False
            self.fault_hold[d] = False
        return True

    def fault_armed(self, d):
        return self.fault_mode[d], bool(self.hold[d])

    def fault_info(self, d):
        s = self.st[d]
        rec = s.rec if s.open else None
        res = None
        if rec is not None and rec.resource is not None:
            res = rec.resource.encode("utf-8")
        fifo = False
        if self.fifo_head < len(self.fifo) and self.fifo_seq != self.fault_fifo_mark[d]:
            fifo = self.fifo[-1].key == self.fifo_seq
        return (s.slot, rec.kind if rec is not None else -1,
                self.fifo_seq if fifo else (rec.corr & _U64 if rec is not None else 0),
                res, fifo)

    def fault_attr(self, d, key, value):
        if self.st[d].open:
            self.add_attr(d, key, value)

    def fault_mark(self, d, on, rule=None):
        self.st[d].mark = bool(on)
        self.st[d].mark_rule = rule if on else None

    def fault_forget(self):
        if self.fifo_head >= len(self.fifo):
            return False
        p = self.fifo[-1]
        if p.key != self.fifo_seq or p.expired:
            return False
        self._timeout(p)
        self.fifo.pop()
        return True

    def fault_step(self, d):
        s = self.st[d]
        if s.remaining > 0:
            return False, s.remaining
        return not s.hdr, s.need - len(s.hdr)

    def fifo_first(self):
        return self.fifo[self.fifo_head].key if self.fifo_head < len(self.fifo) else -1

    def rewrite(self, d, frame):
        return frame

    # ---- protocol hooks -------------------------------------------------------

    def on_header(self, d, h, avail):
        raise NotImplementedError("protocol parsers override on_header")

    def on_body(self, d, chunk):
        pass

    def on_body_end(self, d):
        pass

    # ---- state transitions ------------------------------------------------------

    def want_header(self, d, n):
        if n > self.header_limit:
            self._too_large(d, n)
            return -1
        self.st[d].need = n
        return 0

    def stream_body(self, d, skip):
        self.st[d].body = True
        self.st[d].skip = skip
        return 0

    def capture_frame(self, d):
        if not self.hold[d]:
            raise RuntimeError("capture_frame() needs set_hold(%d, True) first" % d)
        self.st[d].capture |= CAP_REWRITE
        return 0

    def gather(self, d, p, want):
        """From on_body(): (the frame's next `want` body bytes or None, bytes of p taken).

        None with all of p taken when p ended first, or after fail() past header_limit."""
        s = self.st[d]
        n = len(p)
        if not s.gbuf and n >= want:
            return p[:want], want
        if want > self.header_limit:
            self._too_large(d, want)
            return None, n
        if want > s.hcap and not self._hbuf_reserve(d, want):
            return None, n
        take = min(want - len(s.gbuf), n)
        s.gbuf += p[:take]
        if len(s.gbuf) < want:
            return None, take
        got = bytes(s.gbuf)
        s.gbuf = bytearray()
        return got, take

    def fail(self, d, reason, message):
        self.stats.error(d, reason)
        self.error = frame_error_class(self.stats.protocol)(
            "%s: %s" % (self.stats.protocol, message), REASONS[reason], DIRECTIONS[d],
            self.st[d].frame_start)
        return 0

    def protocol_error(self, d, reason):
        self.stats.error(d, reason)

    # ---- recording ------------------------------------------------------------

    def begin(self, d, slot, kind, frame_bytes, header_bytes):
        s = self.st[d]
        if s.open:
            self._emit(s.rec)
        if slot < 0 or slot > OTHER_SLOT:
            slot = OTHER_SLOT
        st = self.stats
        st.frames[d][slot] += 1
        st.frame_bytes[d][slot] += frame_bytes
        s.slot = slot
        s.begun = True
        if not self.recording:              # counters only: no record to fill
            return
        s.open = True
        s.rows = 0
        s.rec = Record(self.now_ns, d, slot, kind, st.slot_opcode(slot), frame_bytes,
                       header_bytes)
        if s.mark:                          # a reply the fault engine made
            self.add_attr(d, b"injected", b"1")
            if s.mark_rule is not None:     # and the rule that made it
                self.add_attr(d, b"fault", s.mark_rule)

    def add_messages(self, d, n):
        s = self.st[d]
        self.stats.messages[d][s.slot] += n
        self.feed_work += n
        if self.recording:
            s.rec.messages += n

    def entry(self, d):
        if not self.recording:
            return
        s = self.st[d]
        rec = s.rec
        if s.rows > 0:
            self._emit(rec)
            old = rec
            rec = s.rec = Record(rec.t_ns, d, rec.slot, rec.kind, rec.opcode, 0, 0)
            rec.resource, rec.attrs, rec.abytes = old.resource, old.attrs, old.abytes
        s.rows += 1
        rec.messages = 1

    def set_corr(self, d, corr, corr_hi):
        if not self.recording:
            return
        rec = self.st[d].rec
        rec.corr = corr
        rec.corr_hi = corr_hi
        rec.corr_fmt = _corr_fmt(corr_hi)

    def set_status(self, d, status, outcome):
        s = self.st[d]
        self.stats.response(s.slot, status)
        if not self.recording:
            return
        rec = s.rec
        rec.status = status
        rec.has_status = True
        rec.outcome = outcome

    def _map_resize(self, cap):
        if cap > self.map_cap and _pending["bytes"] + (cap - self.map_cap) * \
                MAP_ENTRY_BYTES > _pending["budget"]:
            return 1
        _pending["bytes"] += (cap - self.map_cap) * MAP_ENTRY_BYTES
        self.map_cap = cap
        return 0

    def _fifo_resize(self, cap):
        if cap > self.fifo_cap and _pending["bytes"] + (cap - self.fifo_cap) * \
                PENDING_BYTES > _pending["budget"]:
            return 1
        _pending["bytes"] += (cap - self.fifo_cap) * PENDING_BYTES
        self.fifo_cap = cap
        return 0

    def expect(self, d, tag, key, corr_hi):
        self.set_corr(d, key, corr_hi)
        self.feed_work += 1
        k = (tag, key)
        n = len(self.map) + len(self.map_dead)
        if (n + 1) * 2 > self.map_cap and n < self.map_limit and not self.map_dead:
            # a table holding expired requests drops those first (below), not grows
            self._map_resize(self.map_cap * 2 if self.map_cap else MAP_MIN_CAP)
        if self.map_cap == 0:
            self.stats.error(d, R_OVERFLOW)
            return 0
        old = self.map.pop(k, None)
        if old is None:
            old = self.map_dead.pop(k, None)
        if old is None:
            if n >= self.map_limit or (n + 1) * 2 > self.map_cap:
                if not self.map_dead:
                    self.stats.error(d, R_OVERFLOW)
                    return 0
                del self.map_dead[next(iter(self.map_dead))]   # the oldest expired
        elif not old.expired:
            self._timeout(old)
        self.stats.in_flight += 1
        self.map[k] = Pending(self.now_ns, key, self.st[d].slot, corr_hi, False, d)
        return 0

    def expect_fifo(self, d, aux):
        self.fifo_seq += 1
        self.set_corr(d, self.fifo_seq, -1)
        n = len(self.fifo) - self.fifo_head
        if n == self.fifo_cap and n < self.fifo_limit:
            self._fifo_resize(self.fifo_cap * 2)
        if n >= self.fifo_limit or n == self.fifo_cap:
            p = self.fifo[self.fifo_head]
            self.fifo_head += 1
            if not p.expired:
                self._timeout(p)
            self.stats.error(d, R_OVERFLOW)
        self.fifo.append(Pending(self.now_ns, self.fifo_seq, self.st[d].slot, aux, True, d))
        self.stats.in_flight += 1
        if self.fifo_head > 1024 and self.fifo_head * 2 > len(self.fifo):
            del self.fifo[:self.fifo_head]
            self.fifo_head = 0
        return 0

    def take(self, d, tag, key):
        p = self.map.pop((tag, key), None)
        if p is None:
            p = self.map_dead.pop((tag, key), None)
        self.st[d].taken = p
        return -1 if p is None else p.slot

    def take_fifo(self, d):
        s = self.st[d]
        if self.fifo_head >= len(self.fifo):
            s.taken = None
            return -1
        p = s.taken = self.fifo[self.fifo_head]
        self.fifo_head += 1
        return p.slot

    def answer(self, d, status, outcome):
        s = self.st[d]
        p = s.taken
        rec = s.rec if self.recording else None
        if rec is not None:
            rec.status = status
            rec.has_status = True
            rec.outcome = outcome
        if p is None:
            self.stats.unmatched += 1
            return
        s.taken = None
        self.stats.response(p.slot, status)
        if rec is not None:
            rec.req_slot = p.slot
            rec.corr = p.key
            rec.corr_hi = p.aux if not p.fifo else -1
            rec.corr_fmt = _corr_fmt(rec.corr_hi)
        if not p.expired:
            dt = max(0, self.now_ns - p.t_ns)
            if rec is not None:
                rec.latency_ns = dt
            self.stats.observe(p.slot, outcome, dt)
            self.stats.in_flight -= 1

    def _timeout(self, p):
        p.expired = True
        st = self.stats
        if self.closed:                     # close(): its connection ended first
            st.cutoffs[p.slot] += 1
        else:
            st.timeouts[p.slot] += 1
        st.in_flight -= 1
        if not self.recording:
            return
        ev = Record(self.now_ns or monotonic_ns(), p.dir, p.slot, K_EVENT,
                    st.slot_opcode(p.slot), 0, 0)
        ev.corr = p.key
        ev.corr_hi = p.aux if not p.fifo else -1
        ev.corr_fmt = _corr_fmt(ev.corr_hi)
        ev.req_slot = p.slot
        ev.status = 1 if self.closed else 0     # _counters.pxd EV_CLOSED / EV_TIMEOUT
        i = self._ctext_find(p.dir, p.slot, p.key) if self.ctext_len else -1
        if i >= 0:                          # the request's string id (set_corr_str)
            ev.cid = self.ctext[i][3]
            ev.corr_fmt = CORR_NONE if ev.cid is None else CORR_STR
            self._ctext_drop(i)
        elif self.ctext:                    # evicted, or sent before recording began
            ev.corr_fmt = CORR_NONE
        self._emit(ev)

    # ---- string correlation ids kept for timeout rows (_framelog.pxd, CorrText) ----

    def _ctext_keep(self, d, rec):
        cap = len(self.ctext) if self.ctext else 0
        if (self.ctext_len + 1) * 2 > cap and cap < CORR_TEXT_SLOTS:
            new_cap = cap * 2 if cap else 16
            old, self.ctext, self.ctext_len = self.ctext or [], [None] * new_cap, 0
            for e in old:                   # in index order, as the compiled core does
                if e is not None:
                    i = ctext_index(e[0], e[1], e[2], new_cap)
                    if self.ctext[i] is None:
                        self.ctext_len += 1
                    self.ctext[i] = e
            cap = new_cap
        i = ctext_index(d, rec.slot, rec.corr, cap)
        e = self.ctext[i]
        if e is None:
            self.ctext_len += 1
        refs = 1
        if e is not None and e[:3] == [d, rec.slot, rec.corr & _U64]:
            refs = min(e[4] + 1, 32767)     # another pending request with this identity
        self.ctext[i] = [d, rec.slot, rec.corr & _U64, rec.cid, refs]

    def _ctext_find(self, d, slot, key):
        if not self.ctext:
            return -1
        i = ctext_index(d, slot, key, len(self.ctext))
        e = self.ctext[i]
        return i if e is not None and e[:3] == [d, slot, key & _U64] else -1

    def _ctext_drop(self, i):
        if i >= 0:
            e = self.ctext[i]
            e[4] -= 1
            if e[4] <= 0:
                self.ctext[i] = None
                self.ctext_len -= 1

    @property
    def tracer(self):
        """A callable given each finished record as a dict (tests), or None."""
        return self._tracer

    @tracer.setter
    def tracer(self, fn):
        self._tracer = fn
        self.recording = fn is not None or self.log is not None or self.fault_rec

    def attach_log(self, log, route):
        """Write this connection's records to ``log`` (a FrameLogBuffer, as route index
        ``route``), or stop with ``log=None``."""
        self.log = log
        self.log_route = route
        self.recording = log is not None or self._tracer is not None or self.fault_rec

    def _emit(self, rec):
        if self.log is None and self._tracer is None:
            return
        if self.ctext_len and rec.req_slot >= 0 and rec.latency_ns >= 0 and rec.kind != K_EVENT:
            # a response answered its request in time: its kept string id is not needed
            self._ctext_drop(self._ctext_find(1 - rec.direction, rec.req_slot, rec.corr))
        row = self._record_dict(rec)
        if self.log is not None:
            self.log.append(row, self.log_route)
        if self._tracer is not None:
            try:
                self._tracer(dict(row))
            except BaseException as exc:    # raised when the public call returns
                if self._tracer_error is None:
                    self._tracer_error = exc

    def _record_dict(self, rec):
        return record_dict(self.stats, self.conn_id,
                           {k: getattr(rec, k) for k in Record.__slots__},
                           rec.resource, dict(rec.attrs) if rec.attrs else None)

    def set_resource(self, d, data):
        """The frame's frame-log ``resource`` (bytes, UTF-8; at most RESOURCE_MAX kept)."""
        if self.recording:
            self.st[d].rec.resource = bytes(data[:RESOURCE_MAX]).decode("utf-8", "replace")

    def set_corr_str(self, d, data, prefix=b""):
        """The frame's frame-log ``correlation_id`` as text: prefix + data (bytes, UTF-8,
        clipped by framing_common.clip_corr); data None: no correlation id (null).  After
        expect()/answer(); on a request also kept for its timeout row."""
        if not self.recording:
            return
        s = self.st[d]
        if not s.open:
            return
        rec = s.rec
        was = rec.corr_fmt
        rec.cid = (None if data is None else
                   clip_corr(bytes(prefix) + bytes(data)).decode("utf-8", "replace"))
        rec.corr_fmt = CORR_NONE if data is None else CORR_STR
        if rec.kind == K_REQUEST and was != CORR_NONE and was != CORR_STR:
            self._ctext_keep(d, rec)

    def add_attr(self, d, key, value):
        """One frame-log ``attrs`` entry (bytes, bytes) for the current frame."""
        if not self.recording:
            return
        rec = self.st[d].rec
        kn, vn = len(key), len(value)
        if kn > 65535 or vn > 65535 or rec.abytes + 4 + kn + vn > ATTRS_MAX:
            return
        rec.abytes += 4 + kn + vn
        if rec.attrs is None:
            rec.attrs = {}
        rec.attrs[bytes(key).decode("utf-8", "replace")] = bytes(value).decode("utf-8",
                                                                               "replace")

    # ---- lifecycle ------------------------------------------------------------

    def _pending(self):
        """The requests not yet counted as timeouts may be among these: the FIFO from
        its first unexpired entry, and the live map (close() and abandon() walk no
        more, as the compiled core)."""
        fifo, head = self.fifo, self.fifo_head
        i = head
        if head < len(fifo) and self.fifo_live > fifo[head].key:
            i = min(head + self.fifo_live - fifo[head].key, len(fifo))
            while i > head and not fifo[i - 1].expired:
                i -= 1                          # a gap the fault engine left (fault_forget)
        yield from fifo[i:]
        yield from self.map.values()

    def expire(self, now=0, limit=0):
        now = now or monotonic_ns()
        limit = limit if limit > 0 else float("inf")
        self.now_ns = now
        n = 0
        fifo, head = self.fifo, self.fifo_head
        i = head
        if head < len(fifo) and self.fifo_live > fifo[head].key:
            i = min(head + self.fifo_live - fifo[head].key, len(fifo))
            while i > head and not fifo[i - 1].expired:
                i -= 1                          # a gap the fault engine left (fault_forget)
        while i < len(fifo) and n < limit:
            p = fifo[i]
            if now - p.t_ns < self.timeout_ns:
                break
            if not p.expired:
                self._timeout(p)
                n += 1
            i += 1
        self.fifo_live = self.fifo_seq + 1 if i == len(fifo) else fifo[i].key
        gone = []
        if n < limit:
            for k, p in self.map.items():      # request order: stop at the first young
                if now - p.t_ns < self.timeout_ns or n + len(gone) >= limit:
                    break
                gone.append(k)
        for k in gone:
            p = self.map.pop(k)
            self._timeout(p)
            self.map_dead[k] = p
            n += 1
        if n >= limit:
            if self._tracer_error is not None:
                self._raise_tracer_error()
            return n                            # more may be due: the caller comes back
        self._shrink()
        if self._tracer_error is not None:
            self._raise_tracer_error()
        return n

    def _shrink(self):
        n = len(self.map) + len(self.map_dead)
        if self.map_cap > MAP_MIN_CAP and n * 8 <= self.map_cap:
            cap = MAP_MIN_CAP
            while cap < n * 4:
                cap *= 2
            self._map_resize(cap)
        n = len(self.fifo) - self.fifo_head
        if self.fifo_cap > FIFO_MIN_CAP and n * 8 <= self.fifo_cap:
            cap = FIFO_MIN_CAP
            while cap < n * 2:
                cap *= 2
            self._fifo_resize(cap)

    def _forget_all(self):
        self.fifo = []
        self.fifo_head = 0
        self.map = {}
        self.map_dead = {}
        self._map_resize(0)
        if self.fifo_cap > FIFO_MIN_CAP:
            self._fifo_resize(FIFO_MIN_CAP)

    def __del__(self):
        try:
            _pending["bytes"] -= self.fifo_cap * PENDING_BYTES + self.map_cap * MAP_ENTRY_BYTES \
                + self.st[0].hcap + self.st[1].hcap
        except AttributeError:                  # __init__ did not finish
            pass

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.now_ns = monotonic_ns()
        for d in range(2):
            s = self.st[d]
            if s.open:
                s.open = False
                self._emit(s.rec)
        for p in list(self._pending()):
            if not p.expired:
                self._timeout(p)
        self._forget_all()
        if self.error is None:
            for d in range(2):
                if self.st[d].hdr or self.st[d].remaining > 0:
                    self.stats.error(d, R_TRUNCATED)
        if self._tracer_error is not None:
            self._raise_tracer_error()

    def abandon(self):
        for p in list(self._pending()):
            if not p.expired:
                self.stats.in_flight -= 1
        self._forget_all()

    @property
    def pending_capacity(self):
        return self.map_cap, self.fifo_cap

    @property
    def bytes_fed(self):
        return self.st[0].offset + self.st[1].offset

    @property
    def pending(self):
        return len(self.fifo) - self.fifo_head + len(self.map) + len(self.map_dead)

    def frame_start(self, d):
        return self.st[d].frame_start


class FrameLogBuffer:
    """Twin of _framelog.FrameLogBuffer: a bounded list of (route index, row dict);
    drained by proxy.framelog_native.TwinSource."""

    def __init__(self, chunks=8, chunk_records=32768, arena_bytes=8 << 20):
        if chunks < 2 or chunk_records < 1:
            raise ValueError("a frame-log buffer needs >= 2 chunks of >= 1 record")
        self.limit = chunks * chunk_records
        self.rows = []
        self.routes = []
        self.dropped = []
        self.appended = []
        self.wake = None
        self.wake_at = 1          # as the compiled buffer (its writer batches chunks)

    def add_route(self, stats):
        self.routes.append(stats)
        self.dropped.append(0)
        self.appended.append(0)
        return len(self.routes) - 1

    def append(self, row, route):
        if len(self.rows) >= self.limit:
            self.dropped[route] += 1
            return
        self.rows.append((route, row))
        self.appended[route] += 1
        if len(self.rows) * 2 == self.limit and self.wake is not None:
            self.wake.set()

    def take_rows(self):
        rows, self.rows = self.rows, []
        return rows

    def dropped_counts(self):
        return {s.route: n for s, n in zip(self.routes, self.dropped) if n}

    def appended_counts(self):
        return {s.route: n for s, n in zip(self.routes, self.appended)}
