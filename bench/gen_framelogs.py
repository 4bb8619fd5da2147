"""Generate proxy frame logs of realistic shape, fast, for ``bench/analyze_bench.py``.

Vectorised with pyarrow.compute (no numpy needed): per chunk of request/response pairs
it draws routes and opcodes with weights, lognormal latencies per opcode with a heavy
tail, 2 % error answers, 0.3 % timeouts (an ``event`` row instead of a response), 0.1 %
unmatched responses, oneway requests without an answer, optionally the client side's rows
for a share of the requests (``--client-share``), and writes Parquet files (zstd,
one row group per 64 Ki rows, as the proxy's writer flushes) named like the proxy's
(``proxy-<host>-<pid>-<start>-<seq>.parquet``) with proxy/framelog.py's SCHEMA.

    python bench/gen_framelogs.py DIR                    # 10 M records
    python bench/gen_framelogs.py DIR --records 1000000 --seconds 300
"""

import argparse
import math
import os
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from proxy.framelog import SCHEMA  # noqa: E402

#: (route, protocol, [(opcode, weight, median latency ms, oneway)])
ROUTES = [
    ("fly", "flymq", [("PRODUCE", 40, 1.2, False), ("FETCH", 40, 1.8, False),
                      ("COMMIT", 8, 0.9, False), ("CREATE_TOPIC", 1, 6.0, False),
                      ("HEARTBEAT", 11, 0.3, False)]),
    ("stream", "rabbitmq-stream", [("Publish", 60, 2.5, False), ("Credit", 15, 0.2, True),
                                   ("QueryOffset", 5, 0.8, False), ("StoreOffset", 15, 0.2, True),
                                   ("Metadata", 5, 1.5, False)]),
    ("rmq-broker", "rocketmq", [("SEND_MESSAGE_V2", 50, 3.0, False),
                                ("PULL_MESSAGE", 35, 12.0, False),
                                ("HEART_BEAT", 10, 0.5, False),
                                ("UPDATE_CONSUMER_OFFSET", 5, 0.7, True)]),
]
ROUTE_WEIGHTS = [0.45, 0.35, 0.20]
ERROR_RATE = 0.02
TIMEOUT_RATE = 0.003
UNMATCHED_RATE = 0.001
SIGMA = 0.45                      # lognormal spread; plus a 1 % tail 10x slower
CONNS = 256
ROW_GROUP = 65536


def _pick(u, weights):
    """Indices drawn with ``weights`` from uniforms ``u`` (a DoubleArray)."""
    total = float(sum(weights))
    edges, acc = [], 0.0
    for w in weights[:-1]:
        acc += w / total
        edges.append(acc)
    idx = pa.array([0] * len(u), pa.int32())
    for edge in edges:
        idx = pc.add(idx, pc.cast(pc.greater_equal(u, edge), pa.int32()))
    return idx


def _normal(n):
    """n standard normal draws (Box-Muller on pyarrow's uniforms)."""
    u1 = pc.subtract(1.0, pc.random(n))            # (0, 1]: log is finite
    u2 = pc.random(n)
    radius = pc.sqrt(pc.multiply(-2.0, pc.ln(u1)))
    return pc.multiply(radius, pc.cos(pc.multiply(2 * math.pi, u2)))


def _null_where(mask, values):
    return pc.if_else(mask, pa.scalar(None, values.type), values)


def _int(values):
    """Floats to int64, rounded down."""
    return pc.cast(pc.floor(values), pa.int64())


def build_chunk(pairs, first_pair, start_ns, ns_per_pair, run_id, host, client_share=0.0):
    """One chunk: a request row per pair, its answer (or timeout event), unmatched
    responses, and for ``client_share`` of the answered pairs the client's own row (the
    same peer and correlation id; its latency adds ~150 us outside the server); returns
    (proxy Table, client Table) with SCHEMA."""
    # flatten the opcode table: global opcode index -> route, names, latency, oneway
    op_route, op_name, op_median, op_oneway, op_weight = [], [], [], [], []
    for r, (_, _, ops) in enumerate(ROUTES):
        total = sum(w for _, w, _, _ in ops)
        for name, w, median, oneway in ops:
            op_route.append(r)
            op_name.append(name)
            op_median.append(median * 1e6)
            op_oneway.append(oneway)
            op_weight.append(ROUTE_WEIGHTS[r] * w / total)
    op = _pick(pc.random(pairs), op_weight)
    route_idx = pc.take(pa.array(op_route, pa.int32()), op)
    route = pc.take(pa.array([r[0] for r in ROUTES]), route_idx)
    protocol = pc.take(pa.array([r[1] for r in ROUTES]), route_idx)
    name = pc.take(pa.array(op_name), op)
    oneway = pc.take(pa.array(op_oneway), op)

    seq = pa.array(range(first_pair, first_pair + pairs), pa.int64())
    ts_req = pc.add(pc.add(start_ns, pc.multiply(seq, ns_per_pair)),
                    _int(pc.multiply(pc.random(pairs), ns_per_pair)))
    conn = _int(pc.multiply(pc.random(pairs), CONNS))
    peer = pc.binary_join_element_wise(
        "10.1.0.", pc.cast(pc.add(pc.divide(conn, 64), 10), pa.string()), ":",
        pc.cast(pc.add(conn, 40000), pa.string()), "")
    corr = pc.cast(seq, pa.string())

    # latency: lognormal around the opcode's median; 1 % of answers 10x slower
    median = pc.take(pa.array(op_median, pa.float64()), op)
    latency = pc.multiply(median, pc.exp(pc.multiply(SIGMA, _normal(pairs))))
    slow = pc.less(pc.random(pairs), 0.01)
    latency = _int(pc.if_else(slow, pc.multiply(latency, 10.0), latency))

    u = pc.random(pairs)
    timeout = pc.and_(pc.less(u, TIMEOUT_RATE), pc.invert(oneway))
    error = pc.and_(pc.greater_equal(u, 1 - ERROR_RATE), pc.invert(oneway))
    req_bytes = _int(pc.add(64, pc.multiply(pc.random(pairs), 2048)))
    resp_bytes = _int(pc.add(32, pc.multiply(pc.random(pairs), 4096)))
    nulls = pa.nulls(pairs, pa.string())

    def table(cols):
        return pa.Table.from_arrays([cols[f.name] for f in SCHEMA], schema=SCHEMA)

    common = {
        "source": pa.array(["proxy"] * pairs), "run_id": pa.array([run_id] * pairs),
        "route": route, "protocol": protocol, "conn_id": conn, "peer": peer,
        "opcode": pc.cast(op, pa.int32()), "correlation_id": corr,
        "resource": nulls, "attrs": pa.nulls(pairs, SCHEMA.field("attrs").type),
    }
    requests = table(dict(
        common, ts_ns=ts_req, direction=pa.array(["c2s"] * pairs), opcode_name=name,
        kind=pc.if_else(oneway, "oneway", "request"), status=nulls, outcome=nulls,
        frame_bytes=req_bytes, header_bytes=pa.array([24] * pairs, pa.int64()),
        payload_bytes=pc.subtract(req_bytes, 24), messages=pa.array([1] * pairs, pa.int64()),
        latency_ns=pa.nulls(pairs, pa.int64()), request_opcode_name=nulls))

    answered = pc.invert(oneway)
    resp_ts = pc.if_else(timeout, pc.add(ts_req, 30_000_000_000), pc.add(ts_req, latency))
    zero = pa.array([0] * pairs, pa.int64())
    responses = table(dict(
        common, ts_ns=resp_ts, direction=pa.array(["s2c"] * pairs),
        opcode_name=pc.if_else(error, "ERROR", name),
        kind=pc.if_else(timeout, "event", "response"),
        status=pc.if_else(timeout, "timeout", pc.if_else(error, "ERROR", "OK")),
        outcome=_null_where(timeout, pc.if_else(error, "error", "ok")),
        frame_bytes=pc.if_else(timeout, zero, resp_bytes),
        header_bytes=pc.if_else(timeout, zero, pa.array([24] * pairs, pa.int64())),
        payload_bytes=pc.if_else(timeout, zero, pc.subtract(resp_bytes, 24)),
        messages=pc.if_else(timeout, zero, pa.array([1] * pairs, pa.int64())),
        latency_ns=_null_where(timeout, latency), request_opcode_name=name))
    responses = responses.filter(answered)

    # unmatched: a response that answers nothing (null latency, null request opcode)
    stray = pc.less(pc.random(pairs), UNMATCHED_RATE)
    unmatched = table(dict(
        common, ts_ns=pc.add(ts_req, 1000), direction=pa.array(["s2c"] * pairs),
        opcode_name=name, kind=pa.array(["response"] * pairs), status=pa.array(["OK"] * pairs),
        outcome=pa.array(["ok"] * pairs), frame_bytes=resp_bytes,
        header_bytes=pa.array([24] * pairs, pa.int64()),
        payload_bytes=pc.subtract(resp_bytes, 24), messages=pa.array([1] * pairs, pa.int64()),
        latency_ns=pa.nulls(pairs, pa.int64()), request_opcode_name=nulls,
        correlation_id=pc.binary_join_element_wise("u", corr, ""))).filter(stray)
    proxy = pa.concat_tables([requests, responses, unmatched])

    # the client's view of a share of the answered requests (Locust rows)
    outside = _int(pc.multiply(150_000.0, pc.exp(pc.multiply(0.5, _normal(pairs)))))
    mine = pc.and_(pc.and_(answered, pc.invert(timeout)),
                   pc.less(pc.random(pairs), client_share))
    client = table(dict(
        common, source=pa.array(["client"] * pairs), route=protocol,
        ts_ns=pc.subtract(ts_req, pc.divide(outside, 2)), direction=pa.array(["c2s"] * pairs),
        opcode_name=name, kind=pa.array(["request"] * pairs),
        status=pc.if_else(error, "ERROR", "OK"), outcome=pc.if_else(error, "error", "ok"),
        frame_bytes=req_bytes, header_bytes=pa.array([24] * pairs, pa.int64()),
        payload_bytes=pc.subtract(req_bytes, 24), messages=pa.array([1] * pairs, pa.int64()),
        latency_ns=pc.add(latency, outside), request_opcode_name=nulls)).filter(mine)
    return proxy, client


def generate(directory, records=10_000_000, seconds=600.0, file_records=2_000_000,
             chunk_pairs=500_000, start_ns=None, run_id="bench-run", host="benchhost",
             quiet=False, client_share=0.0):
    """Write about ``records`` proxy rows into ``directory`` (plus client rows for
    ``client_share`` of the answered requests, in ``client-*`` files); returns
    (proxy rows, files)."""
    os.makedirs(directory, exist_ok=True)
    start_ns = start_ns or (time.time_ns() // 1_000_000_000 - int(seconds)) * 1_000_000_000
    # rows per pair: 1 request + (1 - oneway share) answers + unmatched
    pairs_total = int(records / 1.85)
    ns_per_pair = max(1, int(seconds * 1e9 / pairs_total))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(start_ns / 1e9))
    rows = files = 0
    writer = client_writer = None
    in_file = 0
    first = 0
    while first < pairs_total and rows < records:
        n = min(chunk_pairs, pairs_total - first)
        chunk, client = build_chunk(n, first, start_ns, ns_per_pair, run_id, host,
                                    client_share)
        if client.num_rows:
            if client_writer is None:
                client_final = os.path.join(directory, f"client-{host}-{os.getpid()}-{stamp}-"
                                                       "000001.parquet")
                client_tmp = os.path.join(directory, "." + os.path.basename(client_final)
                                          + ".tmp")
                client_writer = pq.ParquetWriter(client_tmp, SCHEMA, compression="zstd",
                                                 store_schema=False)
            client_writer.write_table(client, row_group_size=ROW_GROUP)
        if rows + chunk.num_rows > records:
            chunk = chunk.slice(0, records - rows)
        first += n
        if writer is None:
            files += 1
            final = os.path.join(directory,
                                 f"proxy-{host}-{os.getpid()}-{stamp}-{files:06d}.parquet")
            tmp = os.path.join(directory, "." + os.path.basename(final) + ".tmp")
            writer = pq.ParquetWriter(tmp, SCHEMA, compression="zstd", store_schema=False)
        writer.write_table(chunk, row_group_size=ROW_GROUP)
        rows += chunk.num_rows
        in_file += chunk.num_rows
        if in_file >= file_records:
            writer.close()
            os.replace(tmp, final)
            writer, in_file = None, 0
        if not quiet:
            print(f"\r{rows:,} records", end="", file=sys.stderr, flush=True)
    if writer is not None:
        writer.close()
        os.replace(tmp, final)
    if client_writer is not None:
        client_writer.close()
        os.replace(client_tmp, client_final)
    if not quiet:
        print(file=sys.stderr)
    return rows, files


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="output directory (created)")
    p.add_argument("--records", type=int, default=10_000_000, help="rows to write (10 M)")
    p.add_argument("--seconds", type=float, default=600.0, help="time span of the run (600)")
    p.add_argument("--file-records", type=int, default=2_000_000,
                   help="rows per file before rotating (2 M)")
    p.add_argument("--client-share", type=float, default=0.0,
                   help="fraction of answered requests the client side logs too (0)")
    args = p.parse_args(argv)
    t = time.monotonic()
    rows, files = generate(args.dir, args.records, args.seconds, args.file_records,
                           client_share=args.client_share)
    dt = time.monotonic() - t
    size = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir)
               if f.endswith(".parquet"))
    print(f"{rows:,} proxy records in {files} files ({size / 2**20:,.0f} MiB with any client "
          f"files) written to {args.dir} in {dt:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
