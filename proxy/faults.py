"""The runtime fault engine: opcode-aware rules and Toxiproxy's toxics on live
connections (docs/design.md, "Faults"; issue 22).

One :class:`RouteFaults` per route reads the route's FaultSet (proxy.faultspec: the
rules and toxics, changed at run time through the API) and arms each connection
(:class:`ConnFaults`), again on every change, live connections included:

* A direction with nothing armed is left alone: the parser forwards as it arrives and
  the relay writes to the real transport, exactly as without this module.
* A direction with rules gets the parser core's per-direction bitmap of the armed
  opcode slots (FrameParser.set_faults): the core holds each frame until its opcode is
  known, forwards the others itself (no Python call) and hands an armed frame whole to
  :meth:`ConnFaults.hook`, which checks resource glob and peer CIDR, draws the trigger
  (one draw from the route's seeded random.Random) and acts: delay, drop, close, error.
* A direction with rules or toxics writes through a :class:`proxy.toxics.Pipe` (delays
  keep the connection's order; toxics act on the bytes after parsing).

``error`` is answered by the protocol's own reply (proxy.protocols.<name>.faults:
error_status / error_reply / DEFAULT_ERROR), fed to the parser as if the server had
sent it, at a frame boundary of the server's stream and, for FIFO protocols (FlyMQ),
only once every earlier request is answered: it is counted and timed like a real
response and its frame-log row carries attrs.injected = "1".
"""

import fnmatch
import ipaddress
import logging
import random
import socket
import struct
import weakref
from collections import deque

from proxy.toxics import Pipe

log = logging.getLogger("frametap.faults")

K_REQUEST, K_RESPONSE, K_ONEWAY = 0, 1, 2      # framing_common.KINDS
STREAMS = {"upstream": 0, "downstream": 1}     # Toxiproxy's stream -> direction
_LINGER0 = struct.pack("ii", 1, 0)


class FaultHit:
    """What the hook leaves in the parser's output in place of an armed frame that a
    rule took: the relay hands it to the direction's Pipe (``ConnFaults.hit``)."""

    __slots__ = ("action", "frame", "seconds", "rst")

    def __init__(self, action, frame=None, seconds=0.0, rst=False):
        self.action = action
        self.frame = frame
        self.seconds = seconds
        self.rst = rst


class RuleState:
    """A rule and its trigger's state (per route: `once` fires once per route)."""

    __slots__ = ("rule", "seen", "fired", "reply_status")

    def __init__(self, rule):
        self.rule = rule
        self.seen = 0          # matching frames (nth)
        self.fired = 0
        self.reply_status = None   # (code, label) of an error rule, resolved on first use

    @property
    def spent(self):
        r = self.rule
        return (r.trigger == "once" and self.fired >= 1) or (
            r.trigger == "times" and self.fired >= r.n)

    def draw(self, rng):
        """Whether the rule fires on this frame (one draw for probability)."""
        r = self.rule
        t = r.trigger
        if t == "probability":
            fire = r.probability >= 1.0 or rng.random() < r.probability
        elif t == "nth":
            self.seen += 1
            fire = r.n > 0 and self.seen % r.n == 0
        else:                              # once, times: the first ones (spent is checked)
            fire = True
        if fire:
            self.fired += 1
        return fire


def _rule_key(rule):
    """A rule's trigger state follows the Rule object (proxy.faultspec: immutable, an
    update makes a new one): a rule changed through the API counts afresh, one left
    alone keeps its count."""
    return rule


class RouteFaults:
    """The fault engine of one route (``route.faults``)."""

    def __init__(self, route, faultset=None, seed=None, replies=None):
        self.route = route
        self.loop = route.loop
        if seed is None:
            seed = random.SystemRandom().randrange(1 << 63)
            log.info("route %s: fault seed %d (set [proxy] seed to repeat a run)",
                     route.cfg.name, seed)
        self.seed = seed
        # per route: the [proxy] seed and the route's name (routes draw apart, repeatably)
        self.rng = random.Random("%d:%s" % (seed, route.cfg.name))
        self._replies = replies        # module-like: error_status, error_reply, DEFAULT_ERROR
        self.injected = {}             # (opcode, fault, action) -> count (metrics)
        self.faultset = None
        self.version = -1
        self.rules = [[], []]          # per direction: [RuleState] in order
        self.toxics = [[], []]         # per direction: [Toxic] in order
        self.modes = [(0, (), False)] * 2  # per direction: set_faults(mode, slots, record)
        self._names = {}               # opcode name -> slot, resolved
        self._codes = None             # opcode name -> numeric code (from the namer)
        self._slot_names = {}
        self._states = {}              # _rule_key -> RuleState
        if faultset is not None:
            self.bind(faultset)

    # ---- configuration --------------------------------------------------------

    def bind(self, faultset):
        """Follow ``faultset`` (its subscribe() callback re-arms every connection)."""
        self.faultset = faultset
        faultset.subscribe(self.reload)
        self.reload()

    @property
    def replies(self):
        if self._replies is None:
            from proxy.protocols.fault_replies import for_protocol
            self._replies = for_protocol(self.route.cfg.protocol)
        return self._replies

    def reload(self):
        fs = self.faultset
        rules = list(fs.rules()) if fs is not None else []
        toxics = list(fs.toxics()) if fs is not None else []
        self.version = getattr(fs, "version", 0)
        states = {}
        per_dir = [[], []]
        for rule in rules:
            key = _rule_key(rule)
            st = self._states.get(key) or states.get(key) or RuleState(rule)
            st.rule = rule
            states[key] = st
            for d in sorted(rule.directions):
                per_dir[d].append(st)
        self._states = states
        self.rules = per_dir
        self.toxics = [[t for t in toxics if STREAMS.get(t.stream) == d] for d in (0, 1)]
        self._modes_stale = True
        for conn in list(self.route.connections):
            fx = getattr(conn, "fx", None)
            if fx is not None:
                fx.apply()
            elif self.active and conn.parser is not None and not conn.closed:
                self.attach(conn)

    def _modes(self):
        """Per direction (mode, slots, record): every frame when a rule names no
        opcode; the parser records (frame kind, resource) only when a rule matches on
        a resource glob (error rules ask the protocol's is_request())."""
        if not self._modes_stale:
            return self.modes
        modes = []
        for d in (0, 1):
            states = self.rules[d]
            record = any(st.rule.resource is not None for st in states)
            if not states:
                modes.append((0, (), False))
            elif any(st.rule.opcodes is None for st in states):
                modes.append((2, (), record))
            else:
                slots = set()
                for st in states:
                    for name in st.rule.opcodes:
                        slots.update(self.slots_of(name))
                modes.append((1, tuple(sorted(slots)), record))
        self.modes = modes
        self._modes_stale = False
        return modes

    def slots_of(self, name):
        """The route's opcode slots a rule's opcode name may take."""
        if name in self._names:
            return self._names[name]
        stats = self.route.stats
        code = self._code_of(name)
        if code is not None:
            slots = (stats.opcode_slot(code),)
        else:                              # interned names (Thrift methods)
            slots = (stats.name_slot(name),)
        if stats.opcode_namer is not None:     # resolved for good once the namer is known
            self._names[name] = slots
        return slots

    def _code_of(self, name):
        stats = self.route.stats
        if name.startswith("unknown_") and name[8:].isdigit():
            return int(name[8:])
        namer = stats.opcode_namer
        if namer is None:
            return None
        if self._codes is None:
            codes = {}
            for code in range(65536):      # once per route
                try:
                    n = namer(code)
                except Exception:
                    continue
                if n and not n.startswith("unknown"):
                    codes.setdefault(n, code)
            self._codes = codes
        return self._codes.get(name)

    def slot_name(self, slot):
        name = self._slot_names.get(slot)
        if name is None:
            name = self._slot_names[slot] = self.route.stats.slot_name(slot)
        return name

    # ---- connections ------------------------------------------------------------

    @property
    def active(self):
        return bool(self.rules[0] or self.rules[1] or self.toxics[0] or self.toxics[1])

    def attach(self, conn):
        """A new connection (its parser made, its upstream not connected yet): arm its
        parser, so that rules see its first bytes (nothing while the route has no rule
        or toxic: reload() attaches the open connections when one comes)."""
        if self.active:
            conn.fx = ConnFaults(self, conn)
            conn.fx.apply()

    def connected(self, conn):
        """Its upstream is up: the pipes (delays, toxics) go in before the first write."""
        fx = getattr(conn, "fx", None)
        if fx is not None:
            fx.apply()

    def count(self, opcode, fault, action):
        key = (opcode, fault, action)
        self.injected[key] = self.injected.get(key, 0) + 1


class ConnFaults:
    """One connection's armed state: its pipes, its injected replies waiting for their
    place in the server's stream, its toxicity draws."""

    def __init__(self, engine, conn):
        self.engine = engine
        # weak: the connection holds this object (fx, its parser's hook, its pipes), so
        # a strong reference back would make every armed connection a reference cycle
        self._conn = weakref.ref(conn)
        self.pipes = [None, None]
        self.want_pipe = [False, False]   # a delay/close marker waits for its pipe
        self.pending = [None, None]    # set_faults() that must wait for a frame boundary
        self.inject_q = deque()        # (reply bytes, FIFO sequence number or None, rule)
        self.injecting = False
        self.retry = None
        self.backoff = 0.002
        self.draws = {}                # toxic name -> active on this connection
        self.peer_ip = None
        peer = conn.transport.get_extra_info("peername") if conn.transport else None
        if isinstance(peer, tuple) and peer:
            try:
                self.peer_ip = ipaddress.ip_address(peer[0].split("%")[0])
                if self.peer_ip.version == 6 and self.peer_ip.ipv4_mapped:
                    self.peer_ip = self.peer_ip.ipv4_mapped
            except ValueError:
                pass

    @property
    def conn(self):
        return self._conn()

    # ---- arming -------------------------------------------------------------------

    def apply(self):
        """Bring this connection in line with the engine's rules and toxics."""
        conn = self.conn
        if conn is None or conn.closed or conn.parser is None:
            return
        eng = self.engine
        modes = eng._modes()
        parser = conn.parser
        if parser.fault_hook is None and (modes[0][0] or modes[1][0]):
            parser.fault_hook = self.hook
        for d in (0, 1):
            mode, slots, record = modes[d]
            self.pending[d] = (None if parser.set_faults(d, mode, slots, record)
                               else modes[d])
            active = []
            for t in eng.toxics[d]:
                on = self.draws.get(t.name)
                if on is None:             # toxicity: one draw per connection and toxic
                    on = t.toxicity >= 1.0 or eng.rng.random() < t.toxicity
                    self.draws[t.name] = on
                if on:
                    active.append((t.name, t.type, dict(t.attributes)))
            names = {t.name for t in eng.toxics[0] + eng.toxics[1]}
            for gone in [n for n in self.draws if n not in names]:
                del self.draws[gone]       # removed: a toxic added again draws afresh
            # a pipe only while toxics run or a rule's delay/close is in it: a rule that
            # does not fire leaves the relay writing to the real transport
            pipe = self.pipes[d]
            if pipe is None and (active or self.want_pipe[d]) and conn.upstream is not None:
                pipe = self._install(d)        # (before the upstream is up: connected())
            if pipe is not None:
                pipe.set_toxics(active)
                if pipe.idle and not self.want_pipe[d]:
                    self._uninstall(d)
        if any(self.pending) and self.retry is None:
            self.backoff = 0.002
            self.retry = eng.loop.call_later(self.backoff, self._retry)

    def _retry(self):
        """A header split across reads, or a held frame, delayed a set_faults(): again."""
        self.retry = None
        conn = self.conn
        if conn is None or conn.closed or conn.parser is None:
            return
        for d in (0, 1):
            if self.pending[d] is not None:
                if conn.parser.set_faults(d, *self.pending[d]):
                    self.pending[d] = None
        if any(self.pending):             # a client idle mid-header: back off to 0.1 s
            self.backoff = min(0.1, self.backoff * 2)
            self.retry = self.engine.loop.call_later(self.backoff, self._retry)

    def _install(self, d):
        from proxy.relay import WRITE_HIGH, WRITE_LOW
        conn = self.conn
        side = conn.upstream if d == 0 else conn
        pipe = Pipe(self, d, side.transport, self.engine.loop, self.engine.rng,
                    WRITE_HIGH, WRITE_LOW)
        side.transport = pipe
        self.pipes[d] = pipe
        return pipe

    def pipe_drained(self, pipe):
        """The rules stage let its last item go: without toxics the pipe goes."""
        d = pipe.d
        if self.pipes[d] is pipe and pipe.idle:
            self._uninstall(d)

    def _uninstall(self, d):
        conn = self.conn
        pipe = self.pipes[d]
        self.want_pipe[d] = False
        side = conn.upstream if d == 0 else conn
        if side is not None and side.transport is pipe:
            side.transport = pipe.real
        self.pipes[d] = None

    # ---- the hook (called by the parser core with a whole armed frame) ------------

    def hook(self, d, frame):
        if self.injecting:
            return frame                   # our own reply: never a rule's target
        try:
            return self._match(d, frame)
        except Exception as exc:           # a broken reply module must not cost the
            route = self.engine.route      # connection: the frame goes on unharmed
            route.log.warning("route %s: fault rule failed, frame forwarded: %s: %s",
                              route.cfg.name, type(exc).__name__, str(exc)[:200])
            return frame

    def _match(self, d, frame):
        eng = self.engine
        parser = self.conn.parser
        slot, kind, corr, res, fifo = parser.fault_info(d)
        name = eng.slot_name(slot)
        text = None
        for st in eng.rules[d]:
            r = st.rule
            if r.opcodes is not None and name not in r.opcodes:
                continue
            if r.resource is not None:
                if res is None:
                    continue
                if text is None:
                    text = res.decode("utf-8", "replace")
                if not fnmatch.fnmatchcase(text, r.resource):
                    continue
            if r.peer is not None and (self.peer_ip is None
                                       or self.peer_ip.version != r.peer.version
                                       or self.peer_ip not in r.peer):
                continue
            if st.spent:
                continue
            if r.action == "error" and (d != 0 or (kind >= 0 and kind != K_REQUEST)
                                        or not self.engine.replies.is_request(frame)):
                continue                   # oneway, responses: delay, drop, close only
            # the first matching rule decides, by its trigger
            if not st.draw(eng.rng):
                return frame
            return self._act(d, st, frame, name, corr, fifo)
        return frame

    def _act(self, d, st, frame, opname, corr, fifo):
        eng = self.engine
        r = st.rule
        parser = self.conn.parser
        action = r.action
        if action == "delay":
            ms = r.delay_ms
            if r.jitter_ms:
                ms += eng.rng.uniform(-r.jitter_ms, r.jitter_ms)
            hit = self._marker(d, FaultHit("delay", frame, max(0.0, ms) / 1000.0))
        elif action == "drop":
            if fifo:
                parser.fault_forget()      # later answers pair with later requests
            hit = b""
        elif action == "close":
            hit = self._marker(d, FaultHit("close", rst=bool(r.rst)))
        else:                              # error
            reply = self._reply(st, frame)
            if reply is None:
                st.fired -= 1              # not applicable: the trigger is not used up
                return frame
            self.inject_q.append((reply, corr if fifo else None,
                                  r.name.encode("utf-8", "replace")))
            if self.conn.relay_hook is None:   # server reads now pass through relay()
                self.conn.relay_hook = self.relay
            eng.loop.call_soon(self.try_inject)
            hit = b""
        parser.fault_attr(d, b"fault", r.name.encode("utf-8", "replace"))
        eng.count(opname, r.name, action)
        return hit

    def _marker(self, d, hit):
        """A marker for the direction's pipe, put in now (the relay looks up its
        destination after feed() returns) or, before the upstream is up, by connected()."""
        self.want_pipe[d] = True
        if self.pipes[d] is None and self.conn.upstream is not None:
            self._install(d)
        return hit

    def _reply(self, st, frame):
        mod = self.engine.replies
        r = st.rule
        if st.reply_status is None:
            st.reply_status = mod.error_status(r.status if r.status is not None
                                               else mod.DEFAULT_ERROR)
        code, label = st.reply_status
        return mod.error_reply(frame, code, label, r.message or "")

    # ---- markers in the parser's output (called by the Pipe, after feed()) ---------

    def hit(self, pipe, h):
        if h.action == "delay":
            pipe.delay(h.frame, h.seconds)
        elif h.action == "close":
            pipe.action(lambda: self.close_connection(h.rst, "rule"))
        # drop, error: nothing goes on

    # ---- injected replies ---------------------------------------------------------

    def relay(self, d, data):
        """conn.relay_hook (what reads of both sides go through instead of the relay's
        ClientSide._relay) while replies wait: server bytes are fed up to each frame
        boundary so that a reply goes in between two frames, in its FIFO place."""
        from proxy.relay import ClientSide
        conn = self.conn
        if conn is None:
            return
        if d == 0 or not self.inject_q:
            ClientSide._relay(conn, d, data)
            self.try_inject()
            return
        parser = conn.parser
        pos, n = 0, len(data)
        while pos < n and not conn.closed and parser.error is None:
            self.try_inject()
            if not self.inject_q:
                ClientSide._relay(conn, 1, data[pos:] if pos else data)
                pos = n
                break
            _, step = parser.fault_step(1)
            step = max(1, min(step, n - pos))
            ClientSide._relay(conn, 1, data[pos:pos + step])
            pos += step
        self.try_inject()

    def try_inject(self):
        """Inject the replies whose turn it is: at a frame boundary of the server's
        stream, and (FIFO) once every earlier request is answered."""
        from proxy.relay import ClientSide
        conn = self.conn
        if conn is None:
            return
        while self.inject_q and not conn.closed and conn.parser is not None:
            parser = conn.parser
            reply, seq, rule = self.inject_q[0]
            at_boundary, _ = parser.fault_step(1)
            if not at_boundary:
                return
            if seq is not None:
                first = parser.fifo_first()
                if first != seq and first != -1 and first < seq:
                    return                 # earlier requests still await their answers
            self.inject_q.popleft()
            self.injecting = True
            parser.fault_mark(1, True, rule)
            try:
                ClientSide._relay(conn, 1, reply)
            finally:
                parser.fault_mark(1, False)
                self.injecting = False
        if not self.inject_q and conn.relay_hook is not None:
            conn.relay_hook = None         # back to the relay's own (compiled) path

    # ---- toxics and closes ----------------------------------------------------------

    def toxic_started(self, d, stage):
        if stage.kind not in ("limit_data", "timeout", "reset_peer"):
            self.engine.count("", stage.name, stage.kind)

    def toxic_fired(self, d, stage):
        self.engine.count("", stage.name, stage.kind)

    def pause_source(self, d):
        conn = self.conn
        if conn is None or conn.closed:
            return
        if d == 0:
            conn.upstream_pause_writing()
        else:
            conn.pause_writing()

    def resume_source(self, d):
        conn = self.conn
        if conn is None or conn.closed:
            return
        if d == 0:
            conn.upstream_resume_writing()
        else:
            conn.resume_writing()

    def close_connection(self, rst, why):
        """A rule's close or a toxic's: FIN, or RST (SO_LINGER 0) with ``rst``."""
        conn = self.conn
        if conn is None or conn.closed:
            return
        for pipe in self.pipes:
            if pipe is not None:
                pipe.discard()
        if rst:
            for side in (conn, conn.upstream):
                t = getattr(side, "transport", None) if side is not None else None
                t = getattr(t, "real", t)
                sock = t.get_extra_info("socket") if t is not None else None
                if sock is not None:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
                    except OSError:
                        pass
        for d in (0, 1):                   # the real transports from here on
            if self.pipes[d] is not None:
                self._uninstall(d)
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None
        self.inject_q.clear()
        conn.relay_hook = None
        conn._finish(abort=rst, by="proxy", reason="fault_" + why)
