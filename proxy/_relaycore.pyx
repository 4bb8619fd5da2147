# cython: language_level=3
"""The relay's per-read hot path in C: the bases of proxy.relay's ClientSide/UpstreamSide.

Why this is compiled (docs/design.md, "Performance principles"): at 64-byte frames the
two Python frames every read went through (``data_received`` and ``_relay``: attribute
lookups, calls, len(), comparisons) cost as much as parsing the frames.  Here a plain
read is: uvloop's call of a METH_O method (no argument parsing), one C call into the
parser's ``feed`` (cpdef, through its vtable when the parser is a compiled FrameParser),
a C field test of ``output``, and the peer transport's ``write`` of the very ``data``
object uvloop handed us.  Measured (bench/guard.py, 64 B): 1,231 -> ~910 instructions a
relayed request.  Everything else (bytes before the
upstream is up, rewritten or held output, a protocol error, a parser exception, the
yield after a full read) calls the Python methods proxy/relay.py defines, exactly as
before: ``_relay_slow(d, data, ok)``, ``parser_crashed(d, exc)``, ``_yield(d)``.

relaycore_py.py is the pure-Python twin (FRAMETAP_NO_EXTENSIONS=1); both keep the same
attributes and the same ``_relay(d, data)`` method (proxy/faults.py calls it unbound).

Fields kept in C (the rest of a connection's state stays in its Python ``__dict__``):
``transport`` (a property that also keeps the transport's bound ``write``, so a read does
not look the method up; the fault engine swaps whole transports, never their ``write``)
and ``upstream`` (read by every write), ``parser`` (set through a property
that also keeps it typed when it is a compiled FrameParser; TLS passthrough, the
undecoded route and the WebSocket layer are fed through their Python ``feed``), and
``relay_hook``: the fault engine's replacement for ``_relay`` while injected replies wait
for their place in the server's stream (proxy/faults.py ConnFaults.relay), called for
both directions instead of the C path when set.
"""

cimport cython
from cpython.bytes cimport PyBytes_CheckExact, PyBytes_GET_SIZE

from proxy._framing cimport FrameParser

cdef enum:
    C_FULL_READ = 256000
    C_YIELD_FRAMES = 64

# A read that filled uvloop's whole receive buffer (256,000 bytes) is the one case where
# libuv reads the same socket again in the same loop iteration (up to 32 times): the
# connection yields to the loop before its next read (ClientSide._yield).  Any shorter
# read ends libuv's run on that socket by itself.
FULL_READ = C_FULL_READ
# ... and only when that read held this many frames: parsing costs per frame, so a read of
# big frames (16 KiB, 1 MiB) costs what the pass-through pays and never yields, while 32
# reads of 64 frames in a row stay under a millisecond of parsing
YIELD_FRAMES = C_YIELD_FRAMES


cdef inline Py_ssize_t _size(object data) except -1:
    if PyBytes_CheckExact(data):           # what uvloop hands data_received
        return PyBytes_GET_SIZE(data)
    return len(data)


cdef inline object _bound_write(object transport):
    """A transport's bound ``write``, looked up when the transport is set (uvloop's, or
    the fault engine's Pipe in its place) instead of on every read."""
    return getattr(transport, "write", None)


cdef inline int _send(object transport, object write, object data) except -1:
    if write is not None:
        write(data)
    else:                                  # (no transport: the same error as before)
        transport.write(data)
    return 0


cdef class _Side:
    """What both sides keep in C: the transport and its bound ``write``."""

    cdef object _transport
    cdef object _write                     # _transport.write (see _bound_write)

    @property
    def transport(self):
        return self._transport

    @transport.setter
    def transport(self, value):
        self._transport = value
        self._write = _bound_write(value)


cdef class UpstreamCore(_Side):
    """UpstreamSide's base: forwards its reads to its ClientSide's C path."""

    cdef public ClientCore client

    @cython.binding(False)                 # a plain METH_O method: uvloop's call of it
    def data_received(self, data):         # needs no argument parsing
        _read(self.client, 1, data)


cdef class ClientCore(_Side):
    """ClientSide's base: the hot fields and the per-read path (see the module's doc)."""

    cdef public UpstreamCore upstream      # UpstreamSide once connected, else None
    cdef public object relay_hook          # proxy.faults: callable(d, data) or None
    cdef object _parser
    cdef FrameParser _fp                   # _parser when it is a compiled FrameParser

    @property
    def parser(self):
        return self._parser

    @parser.setter
    def parser(self, value):
        self._parser = value
        self._fp = value if isinstance(value, FrameParser) else None

    @cython.binding(False)
    def data_received(self, data):
        _read(self, 0, data)

    def _relay(self, int d, data):
        """Parse and forward one read (or slice) of direction d: the hot path when every
        frame was fine and nothing is rewritten or held."""
        _relay_c(self, d, data)


cdef int _read(ClientCore conn, int d, object data) except -1:
    """One read of direction d (data_received of either side)."""
    cdef object parser
    if conn.relay_hook is None:
        _relay_c(conn, d, data)
    else:
        conn.relay_hook(d, data)
    if _size(data) >= C_FULL_READ:
        if conn._fp is not None:
            if conn._fp.feed_frames >= C_YIELD_FRAMES:
                conn._yield(d)
        else:
            parser = conn._parser
            if parser.feed_frames >= C_YIELD_FRAMES:
                conn._yield(d)
    return 0


cdef int _relay_c(ClientCore conn, int d, object data) except -1:
    cdef FrameParser fp = conn._fp
    cdef Py_ssize_t n
    cdef object parser
    if fp is not None:
        try:
            n = fp.feed(d, data)
        except Exception as exc:           # a parser bug must cost one connection only
            conn.parser_crashed(d, exc)
            return 0
        return _pass_on(conn, d, data, n, n == _size(data) and fp.output is None)
    # a parser that is not a compiled FrameParser (TLS passthrough, the undecoded route,
    # the WebSocket layer, a Python parser): the same steps through its Python interface
    parser = conn._parser
    try:
        n = parser.feed(d, data)
    except Exception as exc:
        conn.parser_crashed(d, exc)
        return 0
    return _pass_on(conn, d, data, n, n == _size(data) and parser.output is None)


cdef inline int _pass_on(ClientCore conn, int d, object data, Py_ssize_t n,
                         bint whole) except -1:
    """Forward a read whose every byte passed unchanged (``whole``) to the peer; anything
    else is the Python slow path's (relay.py ``_relay_slow``)."""
    if whole:
        if d == 1:
            _send(conn._transport, conn._write, data)
            return 0
        if conn.upstream is not None:
            _send(conn.upstream._transport, conn.upstream._write, data)
            return 0
    conn._relay_slow(d, data, n)
    return 0
