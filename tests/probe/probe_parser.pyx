# cython: language_level=3
"""A test-only parser that asks the core for `want` header bytes per frame (the probe
of issue 7: a header request over the old fixed 64-byte buffer, fed across reads)."""

from libc.stdint cimport uint8_t, int64_t

from proxy._framing cimport FrameParser, RouteStats, K_ONEWAY
from proxy._framing cimport want_header, begin
from proxy._wire cimport be32


cdef class ProbeParser(FrameParser):
    cdef public Py_ssize_t want

    def __init__(self, RouteStats stats, want=100):
        self.header_size = 5
        self.want = want
        FrameParser.__init__(self, stats, 1 << 20, 30.0, None)

    cdef int64_t on_header(self, int d, const uint8_t* h, Py_ssize_t avail) except -2:
        if avail < self.want:
            return want_header(self, d, self.want)
        begin(self, d, self.stats.slot_for(h[4]), K_ONEWAY, be32(h), self.want)
        return be32(h)


from proxy._framing cimport set_resource, add_attr


cdef class ResourceProbe(FrameParser):
    """Emits one record per frame() call with the given resource and attrs (the frame-log
    test's way to drive set_resource/add_attr from Python)."""

    def __init__(self, RouteStats stats):
        self.header_size = 5
        FrameParser.__init__(self, stats, 1 << 20, 30.0, None)

    def frame(self, resource, attrs):
        cdef bytes k, v
        begin(self, 0, self.stats.slot_for(1), K_ONEWAY, 10, 5)
        if resource is not None:
            set_resource(self, 0, <const uint8_t*><char*>resource, len(resource))
        for k, v in attrs:
            add_attr(self, 0, <const uint8_t*><char*>k, len(k), <const uint8_t*><char*>v, len(v))
        self.st[0].open = 0
        self._emit(&self.st[0].rec)


from proxy._framing cimport (K_REQUEST, K_RESPONSE, OUTCOME_OK, expect, take, answer,
                             set_corr_str)


cdef class CorrProbe(FrameParser):
    """Requests and responses with string correlation ids, driven from Python (the
    set_corr_str test; its twin is tests/test_corr_str.py's PyCorrProbe)."""

    def __init__(self, RouteStats stats):
        self.header_size = 5
        FrameParser.__init__(self, stats, 1 << 20, 30.0, None)

    cdef _text(self, int d, text, bytes prefix):
        cdef bytes t
        if text is None:
            set_corr_str(self, d, NULL, 0, NULL, -1)
        else:
            t = text
            set_corr_str(self, d, <const uint8_t*><char*>prefix, len(prefix),
                         <const uint8_t*><char*>t, len(t))

    def request(self, int d, key, text, bytes prefix=b""):
        begin(self, d, self.stats.slot_for(1), K_REQUEST, 10, 5)
        expect(self, d, 0, key, -1)
        self._text(d, text, prefix)
        self.st[d].open = 0
        self._emit(&self.st[d].rec)

    def response(self, int d, key, text, bytes prefix=b""):
        take(self, d, 0, key)
        begin(self, d, self.stats.slot_for(2), K_RESPONSE, 10, 5)
        answer(self, d, 0, OUTCOME_OK)
        self._text(d, text, prefix)
        self.st[d].open = 0
        self._emit(&self.st[d].rec)
