"""The pure-Python twin of proxy/_relaycore.pyx (FRAMETAP_NO_EXTENSIONS=1): the bases of
proxy.relay's ClientSide/UpstreamSide with the per-read path in Python.  Same attributes,
same methods, same calls into the Python slow paths (``_relay_slow``, ``parser_crashed``,
``_yield``); read _relaycore.pyx's module doc for why the compiled one exists."""

# A read that filled uvloop's whole receive buffer (256,000 bytes) is the one case where
# libuv reads the same socket again in the same loop iteration (up to 32 times): the
# connection yields to the loop before its next read (ClientSide._yield).  Any shorter
# read ends libuv's run on that socket by itself.
FULL_READ = 256000
# ... and only when that read held this many frames: parsing costs per frame, so a read of
# big frames (16 KiB, 1 MiB) costs what the pass-through pays and never yields, while 32
# reads of 64 frames in a row stay under a millisecond of parsing
YIELD_FRAMES = 64


def _read(conn, d, data):
    """One read of direction d (data_received of either side)."""
    hook = conn.relay_hook
    if hook is None:
        conn._relay(d, data)
    else:
        hook(d, data)
    if len(data) >= FULL_READ and conn.parser.feed_frames >= YIELD_FRAMES:
        conn._yield(d)


class UpstreamCore:
    """UpstreamSide's base: forwards its reads to its ClientSide."""

    def data_received(self, data):
        _read(self.client, 1, data)


class ClientCore:
    """ClientSide's base: the per-read path."""

    relay_hook = None          # proxy.faults: callable(d, data) replacing _relay, or None

    def data_received(self, data):
        _read(self, 0, data)

    def _relay(self, d, data):
        """Parse and forward one read (or slice) of direction d: the hot path when every
        frame was fine and nothing is rewritten or held."""
        parser = self.parser
        try:
            ok = parser.feed(d, data)
        except Exception as exc:           # a parser bug must cost one connection only
            self.parser_crashed(d, exc)
            return
        if ok == len(data) and parser.output is None:
            if d == 1:
                self.transport.write(data)
                return
            if self.upstream is not None:
                self.upstream.transport.write(data)
                return
        self._relay_slow(d, data, ok)
