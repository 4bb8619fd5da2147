"""The compiled proxy's frame-log source: ``FrameLogBuffer`` chunks -> Arrow tables.

``FrameLogBuffer.columns()`` transposes a chunk of native records into column buffers
(without the GIL); this module wraps them as Arrow arrays without copying and resolves
the repeated strings as dictionary arrays (route, protocol, peer, opcode and status
names are looked up once per distinct value per batch, never per row).  Runs on the
frame-log writer thread.
"""

import logging
import time

import pyarrow as pa
import pyarrow.compute as pc

from proxy.framing_common import DIRECTIONS, KINDS, OPCODE_SLOTS, OUTCOMES

_EMPTY = pa.array([], pa.string())

log = logging.getLogger("frametap.framelog")

#: Columns every native record has (no validity bitmap): written as required Parquet
#: columns, which spares the writer a definition level per value (~1.5 ns per value and
#: column).  Readers see the same names and types (docs/design.md, "Frame log").
REQUIRED = frozenset(("ts_ns", "source", "run_id", "route", "protocol", "conn_id",
                      "direction", "kind", "opcode_name", "frame_bytes", "header_bytes",
                      "payload_bytes", "messages"))


def _fixed(typ, n, values, validity=None):
    bufs = [None if validity is None else pa.py_buffer(validity), pa.py_buffer(values)]
    return pa.Array.from_buffers(typ, n, bufs)


def _strings(n, offsets, data, validity):
    return pa.Array.from_buffers(pa.string(), n, [
        None if validity is None else pa.py_buffer(validity),
        pa.py_buffer(offsets), pa.py_buffer(data)])


def _dict(indices, names):
    """Indices (in range by construction: columns() made them) over a string dictionary."""
    if not isinstance(names, pa.Array):
        names = pa.array(names, pa.string())
    return pa.DictionaryArray.from_arrays(indices, names, safe=False)


def make_source(buffer, run_id, source="proxy"):
    """The FrameLog source draining ``buffer`` (compiled, or the pure-Python twin's)."""
    if hasattr(buffer, "columns"):
        return NativeSource(buffer, run_id, source)
    return TwinSource(buffer, run_id, source)


class NativeSource:
    """Drains a FrameLogBuffer for FrameLog (``drain()`` / ``dropped_counts()``).

    ``peers`` maps conn_id -> the client's ``ip:port``; the relay adds a connection
    when it starts logging it and calls ``forget(conn_id)`` when it closes (the entry
    goes after the next drain, which holds the connection's last records).
    """

    def __init__(self, buffer, run_id, source="proxy"):
        self.buffer = buffer
        self.run_id = run_id
        self.source = source
        self.peers = {}
        self.conn_attrs = {}        # conn_id -> {key: value} of the connection (TLS)
        self._closing = []
        # wall clock = monotonic record time + this offset (one reading per process)
        self.wall_offset_ns = time.time_ns() - time.monotonic_ns()
        self.full = None
        self.batch_chunks = 8       # chunks per table (columns() takes up to 64)
        self.lost = {}              # route -> rows taken but not turned into a table
        self._zero = pa.py_buffer(b"")

    def _zeros(self, size):
        """size zero bytes (the source and run_id columns' indices): one buffer, grown
        when a batch needs more, shared read-only by every table."""
        if self._zero.size < size:
            self._zero = pa.py_buffer(bytes(max(size, 2 * self._zero.size)))
        return self._zero

    def connection(self, conn_id, peer, attrs=None):
        """``attrs``: per-connection entries added to every row's ``attrs`` (a TLS
        connection's version and cipher: proxy.tls.connection_attrs)."""
        self.peers[conn_id] = peer
        if attrs:
            self.conn_attrs[conn_id] = dict(attrs)

    def add_attrs(self, conn_id, attrs):
        """More per-connection attrs (the upstream side's TLS, known once connected)."""
        if conn_id in self.peers:
            self.conn_attrs[conn_id] = {**self.conn_attrs.get(conn_id, {}), **attrs}

    def forget(self, conn_id):
        self._closing.append(conn_id)

    def dropped_counts(self):
        out = dict(self.buffer.dropped_counts())
        for route, n in self.lost.items():
            out[route] = out.get(route, 0) + n
        return out

    def _lose(self, counts, exc):
        """Rows that could not become a table (a bug or no memory): counted, logged."""
        for route, n in counts.items():
            self.lost[route] = self.lost.get(route, 0) + n
        log.warning("frame log: a batch of %d rows could not be converted (%r); counted as "
                    "dropped", sum(counts.values()), exc)

    def drain_full(self):
        """drain() of the full chunks only (the writer woken by a full chunk)."""
        return self.drain(partial=False)

    def drain(self, partial=True):
        """The buffered records as tables of up to ``batch_chunks`` chunks each (one
        row group per table); ``partial=False`` leaves the chunk being filled alone."""
        if partial:
            closing, self._closing = self._closing, []
        else:                  # a closed connection's last rows may be in the filling chunk:
            closing = []       # keep its peer until a drain that takes that chunk too
        tables = []
        while True:
            taken = []
            while len(taken) < self.batch_chunks:
                i = self.buffer.take(partial)
                if i < 0:
                    break
                taken.append(i)
            if not taken:
                break
            cols = None
            try:
                cols = self.buffer.columns(taken, self.wall_offset_ns)
                if cols["n"]:
                    tables.append(self.table(cols))
            except Exception as exc:         # every taken row is counted, never lost
                routes = self.buffer.routes
                if cols is not None:
                    idx = _fixed(pa.int32(), cols["n"], cols["route"])
                    counts = {routes[v["values"]].route: v["counts"]
                              for v in pc.value_counts(idx).to_pylist()}
                else:
                    counts = {routes[r].route: n
                              for r, n in self.buffer.route_counts(taken).items()}
                self._lose(counts, exc)
            finally:
                for i in taken:
                    self.buffer.release(i)
        for conn_id in closing:
            self.peers.pop(conn_id, None)
            self.conn_attrs.pop(conn_id, None)
        return tables

    def _with_conn_attrs(self, attrs, conn_keys, conn_idx, n):
        """``attrs`` (the frames' own) with each row's connection attrs appended, in
        Arrow compute (no Python per row); unchanged when no connection has any."""
        per_conn = [self.conn_attrs.get(k) for k in conn_keys]
        if not any(per_conn):
            return attrs
        mtype = pa.map_(pa.string(), pa.string())
        conn_map = pa.array([list(d.items()) if d else None for d in per_conn], mtype)
        extra = conn_map.take(conn_idx)
        if attrs.null_count == n:
            return extra
        # (the list kernels take no map arrays: lengths and parents from the offsets)
        lens, parents = [], []
        for m in (attrs, extra):
            off = m.offsets
            lens.append(pc.subtract(off[1:], off[:-1]))
            parents.append(pc.list_parent_indices(pa.ListArray.from_arrays(
                off, pa.nulls(len(m.keys), pa.int8()))))
        offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cast(
            pc.cumulative_sum(pc.add(lens[0], lens[1])), pa.int32())])
        parents = pa.concat_arrays(parents)
        order = pc.sort_indices(parents)            # stable: a row's own entries first
        keys = pa.concat_arrays([attrs.keys, extra.keys]).take(order)
        items = pa.concat_arrays([attrs.items, extra.items]).take(order)
        mask = pc.and_(pc.is_null(attrs), pc.is_null(extra))
        return pa.MapArray.from_arrays(offsets, keys, items, mask=mask)

    def table(self, c):
        """One chunk's columns as a pyarrow Table of framelog.SCHEMA's columns."""
        n = c["n"]
        routes = self.buffer.routes
        route_idx = _fixed(pa.int32(), n, c["route"])
        zero = pa.Array.from_buffers(pa.int32(), n, [None, self._zeros(4 * n)])
        # columns() dictionary-encoded the names natively: each distinct key is looked up
        # here once (opcode_name and request_opcode_name share one dictionary)
        names = pa.array([str(routes[k // OPCODE_SLOTS].slot_name(k % OPCODE_SLOTS))
                          for k in c["name_keys"]], pa.string())   # never a null value
        opcode_name = _dict(_fixed(pa.int32(), n, c["name_idx"]), names)
        req_vals, req_valid = c["req_idx"]
        req_name = _dict(_fixed(pa.int32(), n, req_vals, req_valid), names)
        svals, svalid = c["status_idx"]
        snames = []
        for k in c["status_keys"]:
            if k < 0:                        # -1 timeout, -2 cut off by a close
                snames.append("timeout" if k == -1 else "closed")
                continue
            code = k & 0xFFFFFFFF
            if code >= 1 << 31:
                code -= 1 << 32
            namer = routes[k >> 32].status_namer or str
            try:
                snames.append(str(namer(code)))
            except Exception:
                snames.append(str(code))
        status = _dict(_fixed(pa.int32(), n, svals, svalid), snames)
        # peers by conn_id
        conn = _fixed(pa.int64(), n, c["conn_id"])
        peers = [self.peers.get(k) for k in c["conn_keys"]]
        peer_idx = _fixed(pa.int32(), n, c["conn_idx"])
        if None in peers:      # an unknown peer is a null row, never a null dictionary value
            unknown = pa.array([i for i, p in enumerate(peers) if p is None], pa.int32())
            peer_idx = pc.if_else(pc.is_in(peer_idx, value_set=unknown),
                                  pa.scalar(None, pa.int32()), peer_idx)
            peers = ["" if p is None else p for p in peers]
        peer = _dict(peer_idx, peers)
        ovals, ovalid = c["outcome"]
        opv, opvalid = c["opcode"]
        lvals, lvalid = c["latency_ns"]
        ridx, rvalid, nres, roff, rdata = c["resource"]
        m_off, m_valid, k_off, k_data, v_off, v_data = c["attrs"]
        npairs = c["npairs"]
        attrs = pa.MapArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(m_off)]),
            _strings(npairs, k_off, k_data, None),
            _strings(npairs, v_off, v_data, None),
            mask=pc.invert(_fixed(pa.bool_(), n, m_valid)) if n else None)
        if self.conn_attrs and n:
            attrs = self._with_conn_attrs(attrs, c["conn_keys"],
                                          _fixed(pa.int32(), n, c["conn_idx"]), n)
        columns = {
            "ts_ns": _fixed(pa.int64(), n, c["ts_ns"]),
            "source": _dict(zero, [self.source]),
            "run_id": _dict(zero, [self.run_id]),
            "route": _dict(route_idx, [s.route for s in routes]),
            "protocol": _dict(route_idx, [s.protocol for s in routes]),
            "conn_id": conn,
            "peer": peer,
            "direction": _dict(_fixed(pa.int8(), n, c["direction"]), list(DIRECTIONS)),
            "opcode": _fixed(pa.int32(), n, opv, opvalid),
            "opcode_name": opcode_name,
            "kind": _dict(_fixed(pa.int8(), n, c["kind"]), list(KINDS)),
            "correlation_id": _strings(n, *c["correlation_id"]),
            "status": status,
            "outcome": _dict(_fixed(pa.int8(), n, ovals, ovalid), list(OUTCOMES)),
            "frame_bytes": _fixed(pa.int64(), n, c["frame_bytes"]),
            "header_bytes": _fixed(pa.int64(), n, c["header_bytes"]),
            "payload_bytes": _fixed(pa.int64(), n, c["payload_bytes"]),
            "messages": _fixed(pa.int64(), n, c["messages"]),
            "latency_ns": _fixed(pa.int64(), n, lvals, lvalid),
            "request_opcode_name": req_name,
            "resource": _dict(_fixed(pa.int32(), n, ridx, rvalid),
                              _strings(nres, roff, rdata, None)),
            "attrs": attrs,
        }
        return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(
            [pa.field(name, arr.type, nullable=name not in REQUIRED)
             for name, arr in columns.items()]))


class TwinSource(NativeSource):
    """Drains the pure-Python twin's FrameLogBuffer (rows already resolved to names)."""

    def drain_full(self):
        return self.drain()                # no chunks: everything is "full"

    def drain(self):
        closing, self._closing = self._closing, []
        rows = self.buffer.take_rows()
        tables = []
        if rows:
            routes = self.buffer.routes
            out = []
            for route, r in rows:
                stats = routes[route]
                row = dict(r, source=self.source, run_id=self.run_id, route=stats.route,
                           protocol=stats.protocol, peer=self.peers.get(r["conn_id"]),
                           ts_ns=r["t_ns"] + self.wall_offset_ns)
                extra = self.conn_attrs.get(r["conn_id"])
                if extra:                    # the connection's attrs after the frame's own
                    row["attrs"] = {**(row["attrs"] or {}), **extra}
                del row["t_ns"]
                if row["opcode"] is not None and row["opcode"] < 0:
                    row["opcode"] = None     # a name-only opcode (Thrift method), as columns()
                out.append(row)
            from proxy.framelog import SCHEMA
            try:
                tables.append(pa.Table.from_pylist(out, schema=SCHEMA))
            except Exception as exc:         # counted, never lost
                counts = {}
                for row in out:
                    counts[row["route"]] = counts.get(row["route"], 0) + 1
                self._lose(counts, exc)
        for conn_id in closing:
            self.peers.pop(conn_id, None)
            self.conn_attrs.pop(conn_id, None)
        return tables
