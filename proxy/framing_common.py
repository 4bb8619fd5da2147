"""Constants shared by the compiled framing core and its pure-Python twin."""

DIRECTIONS = ("c2s", "s2c")
C2S = 0
S2C = 1

#: Latency buckets in seconds (docs/design.md, "Prometheus metrics").
BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
           0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BUCKETS_NS = tuple(int(round(b * 1e9)) for b in BUCKETS)

OPCODE_SLOTS = 257
OTHER_SLOT = 256
UNKNOWN_LABELS = 16     # unknown_<n> labels per route before unknown codes share "unknown"
STATUS_SLOTS = 32
OUTCOMES = ("ok", "error")

#: Bounded ``reason`` label values of frametap_protocol_errors_total.  The index is
#: the reason id used by the parsers; append only (the compiled core has 32 slots).
REASONS = (
    "bad_magic",           # 0: first bytes are not this protocol's magic
    "bad_version",         # 1: unknown protocol version (frame still forwarded)
    "frame_too_large",     # 2: declared length over max_frame_bytes
    "frame_too_small",     # 3: declared length below the protocol's minimum
    "truncated_frame",     # 4: connection ended in the middle of a frame
    "in_flight_overflow",  # 5: more pending requests than fifo_limit
    "response_mismatch",   # 6: response opcode differs from its request's
    "bad_header",          # 7: malformed header fields
    "unknown_command",     # 8: opcode/key the protocol does not define (frame forwarded)
    "bad_body",            # 9: body fields inconsistent with the frame size
    "header_too_large",    # 10: a header longer than the route's header limit
    "parser_error",        # 11: the parser raised (contained by the relay; connection closed)
    "header_rule",         # 12: a well-formed header breaks the protocol's per-type rules
                           #     (fields required or forbidden for the message type; frame
                           #     forwarded)
    "pending_budget",      # 13: a header split across reads did not fit the process's
                           #     pending-memory budget ([proxy] max_pending_bytes)
    # 14..27: fleximq over WebSocket (proxy/websocket.py says when each is counted)
    "ws_bad_upgrade", "ws_upgrade_refused", "ws_bad_handshake", "ws_reserved_bits",
    "ws_bad_opcode", "ws_unmasked_client_frame", "ws_masked_server_frame",
    "ws_bad_control_frame", "ws_bad_continuation", "ws_oversized", "ws_text_message",
    "ws_bad_close", "ws_frame_after_close", "ws_truncated_frame",
)
R_WS_FIRST = 14                # the first WebSocket reason (_counters.pxd R_WS_FIRST)
R_BAD_MAGIC, R_BAD_VERSION, R_TOO_LARGE, R_TOO_SMALL, R_TRUNCATED, R_OVERFLOW, \
    R_MISMATCH, R_BAD_HEADER, R_UNKNOWN, R_BAD_BODY, R_HEADER_TOO_LARGE, \
    R_PARSER_ERROR, R_HEADER_RULE, R_PENDING_BUDGET = range(14)
HBUF_KEEP = 4096               # a split-header buffer bigger than this is freed after use

#: Frame kinds (frame log ``kind``), by the ids of _counters.pxd's K_* enum.
KINDS = ("request", "response", "oneway", "event")
K_REQUEST, K_RESPONSE, K_ONEWAY, K_EVENT = range(4)
OUTCOME_OK, OUTCOME_ERROR, OUTCOME_NONE = 0, 1, -1
HEADER_LIMIT = 65536           # default header_limit (most header bytes a parser may want)

DEFAULT_FIFO_LIMIT = 65536
DEFAULT_MAP_LIMIT = 65536      # pending keyed requests per connection (e.g. unconfirmed publishes);
                               # its last doubling rehashes 32 Ki entries in one go (docs/design.md)
# What one slot of the pending-request tables costs (the compiled core's 32-byte MapEntry
# plus its int32 request-ring slot, and Pending); both twins account their tables in these
# units against the process's pending budget ([proxy] max_pending_bytes), so they decide
# alike.
MAP_ENTRY_BYTES = 36
PENDING_BYTES = 24
MAP_MIN_CAP = 64
FIFO_MIN_CAP = 8


_U64 = (1 << 64) - 1


RESOURCE_MAX = 256      # frame-log resource bytes kept per frame
ATTRS_MAX = 4096        # frame-log attrs bytes per frame (key + value + 4 per pair)
CORR_STR_MAX = 128      # bytes of a string correlation id kept (set_corr_str)
CORR_TEXT_SLOTS = 1024  # string ids a connection keeps for its timeout rows, at most


def skip_some(left, avail):
    """Pass over bytes a parser does not read (a message body, a string) across reads:
    ``(take, left - take)`` with ``take = min(left, avail)`` of the ``avail`` bytes at
    hand (the compiled twin's ``_wire.skip_some`` lowers ``left`` in place)."""
    take = left if left < avail else avail
    return take, left - take


def clip_corr(text: bytes) -> bytes:
    """A string correlation id as the frame log keeps it: at most CORR_STR_MAX bytes,
    cut at a UTF-8 character boundary (clients that log the same ids use this too)."""
    if len(text) <= CORR_STR_MAX:
        return text
    m = CORR_STR_MAX
    while m > 0 and text[m] & 0xC0 == 0x80:
        m -= 1
    return text[:m]


def record_dict(stats, conn_id, r, resource=None, attrs=None):
    """One frame-log record (a FrameRecord as a dict of its raw fields) with its names
    resolved: what the tracer sees, and the row the frame-log writer produces (minus
    the identity columns: ts_ns, source, run_id, route, protocol, peer)."""
    fmt, corr = r["corr_fmt"], r["corr"] & _U64
    if fmt == 1:
        cid = str(corr)
    elif fmt == 2:
        cid = "%d:%d" % (r["corr_hi"], corr)
    elif fmt == 3:
        cid = str(corr - (1 << 64) if corr >> 63 else corr)
    elif fmt == 4:
        cid = r.get("cid")         # set_corr_str()'s text (the twin's Record.cid)
    else:
        cid = None
    status_name = stats.status_namer or str
    fb, lat = r["frame_bytes"], r["latency_ns"]
    return {
        "t_ns": r["t_ns"], "conn_id": conn_id, "direction": DIRECTIONS[r["direction"]],
        "opcode": r["opcode"], "opcode_name": stats.slot_name(r["slot"]),
        "kind": KINDS[r["kind"]], "correlation_id": cid,
        "status": (("closed" if r["status"] else "timeout") if r["kind"] == K_EVENT else
                   status_name(r["status"]) if r["has_status"] else None),
        "outcome": OUTCOMES[r["outcome"]] if r["outcome"] >= 0 else None,
        "frame_bytes": fb, "header_bytes": r["header_bytes"],
        "payload_bytes": fb - r["header_bytes"] if fb else 0, "messages": r["messages"],
        "latency_ns": lat if lat >= 0 else None,
        "request_opcode_name": stats.slot_name(r["req_slot"]) if r["req_slot"] >= 0 else None,
        "resource": resource, "attrs": attrs,
    }


def route_snapshot(stats, names, statuses, frames, frame_bytes, messages, errors,
                   responses, hist, timeouts, cutoffs, relayed, unmatched, in_flight,
                   connect_hist, connect_sum):
    """RouteStats.snapshot() of both twins: one route's counters as plain Python data,
    read at scrape time.  The twins hand over their raw tables, by slot: ``names`` (the
    opcode label of each slot in use), ``statuses`` (the status label of each status
    slot in use), ``frames`` / ``frame_bytes`` / ``messages`` (per direction, a count
    per opcode slot), ``errors`` (per direction, a count per reason), ``responses``
    (((opcode slot, status slot), count) pairs), ``hist`` (((opcode slot, outcome),
    (bucket counts, sum)) pairs), ``timeouts`` / ``cutoffs`` (a count per opcode slot).
    Slots past ``names`` are "other", status slots past ``statuses`` too; counts of
    slots that share a label add up."""
    names = list(names)
    names.extend(["other"] * (OPCODE_SLOTS - len(names)))
    statuses = list(statuses)
    statuses.extend(["other"] * (STATUS_SLOTS - len(statuses)))
    out_frames, out_bytes, out_msgs, out_errors = {}, {}, {}, {}
    for d in range(2):
        for s, v in enumerate(frames[d]):
            if v:
                key = (DIRECTIONS[d], names[s])
                out_frames[key] = out_frames.get(key, 0) + v
                out_bytes[key] = out_bytes.get(key, 0) + frame_bytes[d][s]
        for s, v in enumerate(messages[d]):
            if v:
                key = (DIRECTIONS[d], names[s])
                out_msgs[key] = out_msgs.get(key, 0) + v
        for r, v in enumerate(errors[d]):
            if v:
                out_errors[(DIRECTIONS[d], REASONS[r])] = v
    out_responses, out_hist, out_timeouts, out_cutoffs = {}, {}, {}, {}
    for (s, r), v in responses:
        key = (names[s], statuses[r])
        out_responses[key] = out_responses.get(key, 0) + v
    for (s, o), (counts, total) in hist:
        out_hist[(names[s], OUTCOMES[o])] = (list(counts), total)
    for s, v in enumerate(timeouts):
        if v:
            out_timeouts[names[s]] = out_timeouts.get(names[s], 0) + v
    for s, v in enumerate(cutoffs):
        if v:
            out_cutoffs[names[s]] = out_cutoffs.get(names[s], 0) + v
    return {
        "route": stats.route, "protocol": stats.protocol,
        "frames": out_frames, "frame_bytes": out_bytes, "messages": out_msgs,
        "bytes": {DIRECTIONS[0]: relayed[0], DIRECTIONS[1]: relayed[1]},
        "responses": out_responses, "hist": out_hist, "timeouts": out_timeouts,
        "cutoffs": out_cutoffs, "unmatched": unmatched, "in_flight": in_flight,
        "errors": out_errors,
        "conn_active": stats.conn_active, "conn_total": stats.conn_total,
        "conn_rejected": stats.conn_rejected, "connect_failures": stats.connect_failures,
        "connect_hist": (list(connect_hist), connect_sum),
    }
