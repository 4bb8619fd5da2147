"""Toxiproxy's toxics on a connection's byte stream, and the transport stand-in that runs
them (docs/design.md, "Faults").

A direction with an armed rule or toxic writes through a :class:`Pipe` put in place of
its destination transport; a direction with neither keeps the real transport, so the
relay's forward-as-it-arrives path is untouched.  The pipe is a chain of stages, in order:

  rules stage (a delay rule's frame, and every later item behind it; close actions)
  -> the toxics of this stream, in the order they were added -> the real transport.

Items are bytes, or the markers EOF (write_eof), CLOSE (close the transport) and
:class:`Action` (a callable run when it reaches the end of the chain, e.g. "close the
connection" after limit_data's last byte).  Every stage keeps order.  Semantics and
units follow Toxiproxy (github.com/Shopify/toxiproxy, toxics/*.go): latency and jitter in
ms; bandwidth ``rate`` in KB/s (1 KB = 1000 B) sent in 100 ms slices; slow_close delays
the close by ``delay`` ms; timeout drops the data and closes after ``timeout`` ms (0:
holds until the toxic is removed, then closes); reset_peer waits ``timeout`` ms after
the first data, then resets (RST); slicer cuts writes into ``average_size`` +-
``size_variation`` bytes, ``delay`` us apart; limit_data closes after ``bytes`` bytes.

Back-pressure: bytes queued in the pipe count towards the relay's high-water mark: above
it the source side stops reading, below the low mark it reads again, so memory stays
bounded whatever the delays.
"""

import logging
import time
from collections import deque

log = logging.getLogger("frametap.toxics")

EOF = "eof"          # write_eof() reached the pipe
CLOSE = "close"      # close() reached the pipe (flush what is queued, then close)
EARLY = 0.0002       # a timer firing this early (libuv's 1 ms clock) still releases


class Action:
    """A callable item: runs when it leaves the chain (after every byte before it)."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


class Stage:
    """One link of the chain.  ``push(item)`` takes an item; ``emit(item)`` passes it on."""

    kind = "stage"
    name = ""

    def __init__(self, pipe):
        self.pipe = pipe
        self.next = None

    def push(self, item):
        self.emit(item)

    def emit(self, item):
        self.next.push(item)

    def update(self, attrs):
        pass

    def remove(self):
        """The stage leaves the chain: nothing it holds is lost (Toxiproxy: "don't drop
        any data on the floor")."""

    def cancel(self):
        """The connection is gone: forget what is held, stop timers."""


class TimedStage(Stage):
    """A FIFO of (due time, item) released by one timer: order is kept, an item is
    never released before the ones ahead of it."""

    drained = None                     # callable(pipe) when the queue empties

    def __init__(self, pipe):
        super().__init__(pipe)
        self.q = deque()
        self.timer = None
        self.last_due = 0.0

    def hold(self, item, due):
        if due < self.last_due:
            due = self.last_due            # never ahead of an earlier item
        self.last_due = due
        if not self.q and due <= self.pipe.now() + EARLY:
            self.emit(item)
            return
        self.q.append((due, item))
        if isinstance(item, (bytes, bytearray, memoryview)):
            self.pipe.queued(len(item))
        if self.timer is None:
            self._arm()

    def _arm(self):
        # due times are time.monotonic(): uvloop's loop.time() is libuv's cached
        # millisecond clock, too coarse for a delay's +-2 ms
        self.timer = self.pipe.loop.call_later(max(0.0, self.q[0][0] - self.pipe.now()),
                                               self._release)

    def _release(self):
        self.timer = None
        now = self.pipe.now() + EARLY
        q = self.q
        while q and q[0][0] <= now:
            _, item = q.popleft()
            if isinstance(item, (bytes, bytearray, memoryview)):
                self.pipe.queued(-len(item))
            self.emit(item)
            if self.pipe.dead:
                return
        if q:
            self._arm()
        elif self.drained is not None:
            self.drained(self.pipe)

    def remove(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        q, self.q = self.q, deque()
        for _, item in q:
            if isinstance(item, (bytes, bytearray, memoryview)):
                self.pipe.queued(-len(item))
            self.emit(item)

    def cancel(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for _, item in self.q:
            if isinstance(item, (bytes, bytearray, memoryview)):
                self.pipe.queued(-len(item))
        self.q.clear()


class Latency(TimedStage):
    """Every item waits latency +- jitter ms from its arrival (toxics/latency.go)."""

    kind = "latency"

    def __init__(self, pipe, attrs):
        super().__init__(pipe)
        self.update(attrs)

    def update(self, attrs):
        self.latency = max(0, int(attrs.get("latency", 0))) / 1000.0
        self.jitter = max(0, int(attrs.get("jitter", 0))) / 1000.0

    def push(self, item):
        delay = self.latency
        if self.jitter:
            delay += self.pipe.rng.uniform(-self.jitter, self.jitter)
        self.hold(item, self.pipe.now() + max(0.0, delay))


class Bandwidth(TimedStage):
    """At most ``rate`` KB/s (1 KB = 1000 B), in slices of 100 ms worth of bytes
    (toxics/bandwidth.go); rate 0 lets everything through."""

    kind = "bandwidth"

    def __init__(self, pipe, attrs):
        super().__init__(pipe)
        self.free_at = 0.0
        self.update(attrs)

    def update(self, attrs):
        self.rate = max(0, int(attrs.get("rate", 0))) * 1000     # bytes per second

    def push(self, item):
        if self.rate <= 0 or not isinstance(item, (bytes, bytearray, memoryview)):
            self.hold(item, self.pipe.now())
            return
        now = self.pipe.now()
        t = max(now, self.free_at)
        step = max(1, self.rate // 10)
        for i in range(0, len(item), step):
            piece = item[i:i + step]
            t += len(piece) / self.rate
            self.hold(bytes(piece), t)
        self.free_at = t


class Slicer(Stage):
    """Cuts each write into pieces of about average_size +- size_variation bytes and
    waits ``delay`` us after each piece, as toxics/slicer.go does (a late timer never
    bunches pieces together: the wait starts when a piece is written)."""

    kind = "slicer"

    def __init__(self, pipe, attrs):
        super().__init__(pipe)
        self.q = deque()
        self.timer = None
        self.update(attrs)

    def update(self, attrs):
        self.average = max(1, int(attrs.get("average_size", 1)))
        self.variation = max(0, int(attrs.get("size_variation", 0)))
        if self.variation >= self.average:
            self.variation = self.average - 1
        self.delay = max(0, int(attrs.get("delay", 0))) / 1e6

    def cuts(self, start, end, out):
        if (end - start) - self.average <= self.variation:
            out.append(end)
            return
        mid = start + (end - start) // 2
        if self.variation:
            mid += self.pipe.rng.randrange(self.variation * 2) - self.variation
        self.cuts(start, mid, out)
        self.cuts(mid, end, out)

    def push(self, item):
        if isinstance(item, (bytes, bytearray, memoryview)) and item:
            ends = []
            self.cuts(0, len(item), ends)
            start = 0
            for end in ends:
                self.q.append(bytes(item[start:end]))
                start = end
            self.pipe.queued(len(item))
        else:
            self.q.append(item)
        if self.timer is None:
            self._pump()

    def _pump(self):
        self.timer = None
        if not self.q:
            return
        item = self.q.popleft()
        if isinstance(item, bytes):
            self.pipe.queued(-len(item))
            self.emit(item)
            if self.delay and not self.pipe.dead:
                self.timer = self.pipe.loop.call_later(self.delay, self._pump)
                return
        else:
            self.emit(item)
        if self.q and not self.pipe.dead:
            self._pump()

    def remove(self):
        self.cancel_timer()
        q, self.q = self.q, deque()
        for item in q:
            if isinstance(item, bytes):
                self.pipe.queued(-len(item))
            self.emit(item)

    def cancel_timer(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def cancel(self):
        self.cancel_timer()
        for item in self.q:
            if isinstance(item, bytes):
                self.pipe.queued(-len(item))
        self.q.clear()


class SlowClose(TimedStage):
    """The close (or EOF) waits ``delay`` ms; data is not delayed (toxics/slow_close.go)."""

    kind = "slow_close"

    def __init__(self, pipe, attrs):
        super().__init__(pipe)
        self.update(attrs)

    def update(self, attrs):
        self.delay = max(0, int(attrs.get("delay", 0))) / 1000.0

    def push(self, item):
        now = self.pipe.now()
        self.hold(item, now + self.delay if item is EOF or item is CLOSE else now)


class LimitData(Stage):
    """Lets ``bytes`` bytes through, then closes the connection (toxics/limit_data.go)."""

    kind = "limit_data"

    def __init__(self, pipe, attrs):
        super().__init__(pipe)
        self.sent = 0
        self.done = False
        self.update(attrs)

    def update(self, attrs):
        self.limit = max(0, int(attrs.get("bytes", 0)))

    def push(self, item):
        if self.done:
            return
        if isinstance(item, (bytes, bytearray, memoryview)):
            left = self.limit - self.sent
            if left < len(item):
                item = item[:max(0, left)]
            if item:
                self.sent += len(item)
                self.emit(item)
            if self.sent >= self.limit:
                self.done = True
                self.pipe.fired(self)
                self.emit(Action(lambda: self.pipe.close_connection(rst=False,
                                                                    why="limit_data")))
            return
        self.emit(item)


class Timeout(Stage):
    """Stops every byte; closes the connection after ``timeout`` ms, or (0) when the toxic
    is removed (toxics/timeout.go, including its Cleanup)."""

    kind = "timeout"

    def __init__(self, pipe, attrs):
        super().__init__(pipe)
        self.timer = None
        self.update(attrs)

    def update(self, attrs):
        self.timeout = max(0, int(attrs.get("timeout", 0))) / 1000.0
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.timeout > 0:
            self.timer = self.pipe.loop.call_later(self.timeout, self._fire)

    def _fire(self):
        self.timer = None
        self.pipe.fired(self)
        self.pipe.close_connection(rst=False, why="timeout")

    def push(self, item):
        if item is EOF or item is CLOSE:
            self.emit(item)                # the data is dropped, closes still pass

    def remove(self):
        self.cancel()
        self.pipe.loop.call_soon(self._fire)

    def cancel(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class ResetPeer(Stage):
    """``timeout`` ms after the first data, the connection is reset (RST: SO_LINGER 0);
    that data and what follows is not delivered (toxics/reset_peer.go)."""

    kind = "reset_peer"

    def __init__(self, pipe, attrs):
        super().__init__(pipe)
        self.timer = None
        self.armed = False
        self.update(attrs)

    def update(self, attrs):
        self.timeout = max(0, int(attrs.get("timeout", 0))) / 1000.0

    def push(self, item):
        if not isinstance(item, (bytes, bytearray, memoryview)):
            self.emit(item)
            return
        if not self.armed:
            self.armed = True
            self.timer = self.pipe.loop.call_later(self.timeout, self._fire)

    def _fire(self):
        self.timer = None
        self.pipe.fired(self)
        self.pipe.close_connection(rst=True, why="reset_peer")

    def cancel(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    remove = cancel


TOXICS = {cls.kind: cls for cls in (Latency, Bandwidth, Slicer, SlowClose, LimitData,
                                    Timeout, ResetPeer)}


class Sink(Stage):
    """The end of the chain: the real transport."""

    kind = "sink"

    def push(self, item):
        pipe = self.pipe
        real = pipe.real
        if isinstance(item, Action):
            item.fn()
            return
        if pipe.dead:
            return
        if item is EOF:
            if not real.is_closing() and real.can_write_eof():
                real.write_eof()
        elif item is CLOSE:
            pipe.dead = True
            real.close()
        elif not real.is_closing():
            real.write(item)


class Pipe:
    """Stands in for a direction's destination transport (``conn.upstream.transport``
    for c2s, ``conn.transport`` for s2c).  ``writelines`` also takes the fault engine's
    markers (proxy.faults.FaultHit) from the parser's output; everything else the relay
    calls (pause_reading, get_extra_info...) goes to the real transport."""

    def __init__(self, owner, d, real, loop, rng, high, low):
        self.owner = owner             # proxy.faults.ConnFaults
        self.d = d
        self.real = real
        self.loop = loop
        self.rng = rng
        self.high = high
        self.low = low
        self.dead = False              # closed or aborted: drop everything
        self.closing = False
        self.held = 0                  # bytes queued in the stages
        self.paused = False            # we paused the source's reading
        self.sink = Sink(self)
        self.rules = TimedStage(self)  # delay rules: later items queue behind
        self.rules.emit = self._after_rules
        self.rules.drained = owner.pipe_drained
        self.toxics = []               # [(name, stage)] in chain order
        self._link()

    now = staticmethod(time.monotonic)

    # the rest of the transport's interface goes to the real one (spelled out: a
    # __getattr__ would slow every attribute lookup on the pipe)
    def pause_reading(self):
        self.real.pause_reading()

    def resume_reading(self):
        self.real.resume_reading()

    def is_reading(self):
        return self.real.is_reading()

    def get_extra_info(self, name, default=None):
        return self.real.get_extra_info(name, default)

    def set_write_buffer_limits(self, high=None, low=None):
        self.real.set_write_buffer_limits(high=high, low=low)

    def get_write_buffer_limits(self):
        return self.real.get_write_buffer_limits()

    def get_write_buffer_size(self):
        return self.real.get_write_buffer_size() + self.held

    def get_protocol(self):
        return self.real.get_protocol()

    def set_protocol(self, protocol):
        self.real.set_protocol(protocol)

    # ---- the chain ------------------------------------------------------------

    def _link(self):
        stages = [s for _, s in self.toxics] + [self.sink]
        self.head = stages[0]
        for a, b in zip(stages, stages[1:]):
            a.next = b

    def _after_rules(self, item):
        if isinstance(item, Action):
            item.fn()                      # a rule's close, in order behind delayed frames
        else:
            self.head.push(item)

    def set_toxics(self, toxics):
        """``toxics``: [(name, type, attributes)] active on this stream, in order.  A
        toxic that stays keeps its state (and queue); one that goes hands what it holds
        to the next; new ones join the end (Toxiproxy's order)."""
        old = dict(self.toxics)
        keep = []
        for name, kind, attrs in toxics:
            st = old.get(name)
            if st is None or st.kind != kind:
                st = TOXICS[kind](self, attrs)
                st.name = name
                self.owner.toxic_started(self.d, st)
            else:
                st.update(attrs)
            keep.append((name, st))
        kept = {id(st) for _, st in keep}
        gone = [st for _, st in self.toxics if id(st) not in kept]
        self.toxics = keep
        self._link()
        for st in gone:                    # what they hold goes on, into the new chain
            st.next = self.head
            st.remove()

    @property
    def idle(self):
        return not self.toxics and not self.rules.q and not self.held

    # ---- the transport's interface -------------------------------------------

    def write(self, data):
        if self.dead or self.closing:
            return
        if self.rules.q:
            self.rules.hold(data, 0.0)
        else:
            self.head.push(data)
        self._check()

    def writelines(self, items):
        for item in items:
            if self.dead or self.closing:
                return
            if isinstance(item, (bytes, bytearray, memoryview)):
                self.write(item)
            else:
                self.owner.hit(self, item)
        self._check()

    def delay(self, data, seconds):
        """A delay rule's frame: released ``seconds`` from now; later items behind it."""
        self.rules.hold(data, self.now() + seconds)
        self._check()

    def action(self, fn):
        """Run fn once every item written before has left the rules stage."""
        if self.rules.q:
            self.rules.hold(Action(fn), 0.0)
        else:
            fn()

    def write_eof(self):
        if self.dead or self.closing:
            return
        if self.rules.q:
            self.rules.hold(EOF, 0.0)
        else:
            self.head.push(EOF)

    def can_write_eof(self):
        return self.real.can_write_eof()

    def is_closing(self):
        return self.dead or self.closing or self.real.is_closing()

    def close(self):
        """Graceful: what is queued still goes out (in its time), then the close."""
        if self.dead or self.closing:
            return
        self.closing = True
        if self.rules.q:
            self.rules.hold(CLOSE, 0.0)
        else:
            self.head.push(CLOSE)

    def abort(self):
        self.discard()
        self.real.abort()

    def discard(self):
        """Drop what is queued and stop every timer (an abort, a fault's close)."""
        self.dead = True
        self.rules.cancel()
        for _, st in self.toxics:
            st.cancel()
        self.held = 0

    # ---- helpers for stages ---------------------------------------------------

    def queued(self, n):
        self.held += n
        if n < 0:
            self._check()

    def _check(self):
        """Bound memory: pause the source above ``high`` queued bytes, resume below
        ``low`` (unless the real transport's own buffer is over its mark)."""
        if self.held > self.high:
            if not self.paused:
                self.paused = True
            self.owner.pause_source(self.d)
        elif self.paused and self.held <= self.low:
            self.paused = False
            if self.real.get_write_buffer_size() <= self.high:
                self.owner.resume_source(self.d)

    def fired(self, stage):
        self.owner.toxic_fired(self.d, stage)

    def close_connection(self, rst, why):
        self.owner.close_connection(rst, why)
