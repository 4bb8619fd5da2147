"""The frame log (docs/design.md, "Frame log"): what the parsers record reaches the files
row for row, for every protocol and both twins; files are named, rotated and renamed as
the contract says; the writer drops and counts instead of blocking; a failing disk is
counted and recovered from."""

import glob
import json
import os
import time

import pyarrow.parquet as pq
import pytest

from proxy import framing_py
from proxy.protocols import load as protocols_load
from proxy.framelog import COLUMNS, SCHEMA, FileSink, FrameLog, RowBuffer, file_stem
from proxy.framelog_native import make_source
from tests.test_conformance import HAVE_C, PROTOCOLS, SPECS, events_sorted, impls

if HAVE_C:
    from proxy import _framing


def buffer_class(label):
    return _framing.FrameLogBuffer if label == "c" else framing_py.FrameLogBuffer


def read_rows(directory):
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "*.parquet"))):
        rows.extend(pq.read_table(path).to_pylist())
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path) as f:
            rows.extend(json.loads(line) for line in f)
    return rows


def logged_run(impl, pkg, conv, directory, fmt="parquet", chunk_records=64, trace=True,
               split=None):
    """Feed one golden conversation with a tracer and the frame log attached; returns
    (tracer records, rows read back from the files, FrameLog).  Without `trace` the
    usual rows take the frame log's in-place path (log_plain, proxy/_framing.pxd), in
    the core's loop or a parser's fast_frames(); `split(data)` cuts each burst into
    reads."""
    label, RouteStats, Parser = impl
    stats = RouteStats("r-" + pkg, SPECS[pkg].name)
    parser = Parser(stats, options=dict(conv.options or {}))
    parser.conn_id = 42
    traced = []
    if trace:
        parser.tracer = traced.append
    buf = buffer_class(label)(max(4, 512 // chunk_records), chunk_records)
    fl = FrameLog(directory, "proxy", fmt, flush_interval=0.05)
    src = fl.add_source(make_source(buf, "run-x"))
    buf.wake = fl.wake
    parser.attach_log(buf, buf.add_route(stats))
    src.connection(42, "127.0.0.1:40000")
    fl.start()
    for d, data in conv.bursts():
        for piece in (split(data) if split else [data]):
            parser.feed(d, piece)
            if parser.error is not None:
                break
        if parser.error is not None:
            break
        time.sleep(0.001)
    parser.close()
    fl.close()
    assert fl.dropped() == {}
    return traced, read_rows(directory), fl


def _conv_cases():
    for pkg, mod in sorted(PROTOCOLS.items()):
        for conv in mod.conversations():
            if conv.records:
                yield pytest.param(pkg, conv, id=f"{pkg}-{conv.name}")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("pkg,conv", list(_conv_cases()))
def test_files_hold_exactly_what_the_parsers_recorded(pkg, conv, fmt, tmp_path):
    for impl in impls(pkg):
        out = tmp_path / impl[0]
        traced, rows, fl = logged_run(impl, pkg, conv, str(out), fmt)
        assert len(rows) == len(traced) > 0
        assert fl.records == {"r-" + pkg: len(rows)} and fl.files == 1
        for got, want in zip(events_sorted(rows), events_sorted(traced)):
            assert set(got) == set(COLUMNS)
            assert got["source"] == "proxy" and got["run_id"] == "run-x"
            assert got["route"] == "r-" + pkg and got["protocol"] == SPECS[pkg].name
            assert got["peer"] == "127.0.0.1:40000"
            # wall clock: the monotonic record time moved to the epoch, within a minute
            assert abs(got["ts_ns"] - time.time_ns()) < 60e9
            for key, value in want.items():
                if key == "t_ns":
                    continue
                if key == "opcode" and value is not None and value < 0:
                    value = None                 # interned names have no numeric opcode
                have = got[key]
                if key == "attrs" and isinstance(have, list):
                    have = dict(have)            # a Parquet map reads back as pairs
                assert have == value, (impl[0], key, got, want)


def _comparable(rows):
    return [dict(r, ts_ns=None, latency_ns=r["latency_ns"] is not None)
            for r in events_sorted(rows)]


@pytest.mark.parametrize("pkg,conv", list(_conv_cases()))
def test_rows_without_a_tracer_are_the_rows_with_one(pkg, conv, tmp_path):
    """A frame log and no tracer: the usual rows are appended in place, from the core's
    loop or a parser's own (FlyMQ's fast_frames), whole reads or one byte at a time;
    the files hold what a tracer saw, in both twins."""
    def bytewise(data):
        return [data[k:k + 1] for k in range(len(data))]

    results = {}
    for impl in impls(pkg):
        _, traced_rows, _ = logged_run(impl, pkg, conv, str(tmp_path / (impl[0] + "-t")))
        for name, split in (("whole", None), ("bytes", bytewise)):
            _, rows, _ = logged_run(impl, pkg, conv, str(tmp_path / f"{impl[0]}-{name}"),
                                    trace=False, split=split)
            assert _comparable(rows) == _comparable(traced_rows), (impl[0], name)
        results[impl[0]] = _comparable(traced_rows)
    if len(results) == 2:
        assert results["c"] == results["py"]


@pytest.mark.parametrize("pkg", ["rabbitmq_stream", "fleximq"])
def test_native_columns_match_the_twin_across_many_chunks(tmp_path, pkg):
    """Many chunks, correlation ids of every format (fleximq: string ids, timeout rows
    included), resources with hostile bytes."""
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    convs = [c for c in PROTOCOLS[pkg].conversations() if c.records]
    assert any(r.get("resource") for c in convs for r in c.records)
    for conv in convs:
        for chunk in (2, 3, 64):               # rows of one frame across chunk boundaries
            results = {}
            for impl in impls(pkg):
                out = tmp_path / f"{pkg}-{conv.name}-{chunk}-{impl[0]}"
                traced, rows, _ = logged_run(impl, pkg, conv, str(out), chunk_records=chunk)
                results[impl[0]] = [dict(r, ts_ns=None, latency_ns=r["latency_ns"] is not None)
                                    for r in events_sorted(rows)]
            assert results["c"] == results["py"], (conv.name, chunk)


PUBLISHING_IDS = [0, 1, 9, 10, 99, 100, 101, 999, 1000, 65535, 10**9, 10**18 - 1, 10**18,
                  10**19 - 1, 10**19, 12345678901234567890, 2**63 - 1, 2**63, 2**64 - 1]


def test_correlation_ids_are_exact_decimal_at_every_digit_count():
    """The writer's decimal formatting (columns(), two digits per step) gives every
    publishing id exactly, at each digit count and at the u64/i64 edges, as the twin."""
    from proxy.protocols.rabbitmq_stream import codec
    frame = codec.encode_command(codec.PUBLISH, publisher_id=3, messages=[
        codec.PublishedMessage(i, b"x") for i in PUBLISHING_IDS])
    for label, RouteStats, Parser in impls("rabbitmq_stream"):
        stats = RouteStats("r", SPECS["rabbitmq_stream"].name)
        parser = Parser(stats)
        parser.conn_id = 1
        buf = buffer_class(label)(4, 64)
        parser.attach_log(buf, buf.add_route(stats))
        src = make_source(buf, "run-d")
        src.connection(1, "127.0.0.1:1")
        parser.feed(0, frame)
        rows = [r for t in src.drain() for r in t.to_pylist()]
        assert [r["correlation_id"] for r in rows] == [f"3:{i}" for i in PUBLISHING_IDS], label
        assert [r["opcode_name"] for r in rows] == ["Publish"] * len(PUBLISHING_IDS), label


def test_native_batch_with_thousands_of_connections_keeps_each_rows_peer():
    """columns() dictionary-encodes peers by connection id in a table that grows past its
    first size (256 slots): 3,000 connections in one batch, interleaved, each row keeps
    its own connection's peer; an unknown connection's rows get a null peer."""
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    from proxy.protocols.flymq import samples
    _, reqs, resps = samples.bench_frames(1, 64)
    stats = _framing.RouteStats("r", "flymq")
    buf = _framing.FrameLogBuffer(4, 16384)
    route = buf.add_route(stats)
    src = make_source(buf, "run-p")
    Parser = protocols_load("flymq").load_parser()
    parsers = []
    for i in range(3000):
        p = Parser(stats)
        p.conn_id = 1000 + i
        p.attach_log(buf, route)
        if i != 77:                                  # connection 1077: peer unknown
            src.connection(1000 + i, "10.%d.%d.1:%d" % (i // 256, i % 256, 1000 + i))
        parsers.append(p)
    for p in parsers:                                # requests, then answers: interleaved
        p.feed(0, reqs[0])
    for p in reversed(parsers):
        p.feed(1, resps[0])
    tables = src.drain()
    assert len(tables) == 1
    rows = tables[0].to_pylist()
    assert len(rows) == 6000
    for r in rows:
        i = r["conn_id"] - 1000
        want = None if i == 77 else "10.%d.%d.1:%d" % (i // 256, i % 256, 1000 + i)
        assert r["peer"] == want, r
    answers = [r for r in rows if r["kind"] == "response"]
    assert len(answers) == 3000 and {r["request_opcode_name"] for r in answers} == {"PRODUCE"}
    assert all(r["latency_ns"] is not None for r in answers)


def test_native_resource_dictionary_across_chunks_and_growth():
    """columns() dictionary-encodes resources by their bytes: 306 distinct ones (past the
    table's first size), repeated at random over several chunks of one batch, invalid
    UTF-8 among them (each byte of a bad sequence a '?'), the empty and a 256-byte one;
    every row keeps its own frame's resource."""
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    import random
    import struct
    from proxy.protocols.flymq import samples
    rng = random.Random(5)
    topics = ([b"t%d" % i for i in range(300)] + [b"\xff\xfebad", b"", b"x" * 256,
              b"caf\xc3\xa9", b"ab\xc3", b"12345678\x80abcdefgh"])
    seq = [rng.choice(topics) for _ in range(5000)]
    stats = _framing.RouteStats("r", "flymq")
    buf = _framing.FrameLogBuffer(8, 1024)
    route = buf.add_route(stats)
    p = protocols_load("flymq").load_parser()(stats)
    p.conn_id = 1
    p.attach_log(buf, route)
    src = make_source(buf, "run-r")
    src.connection(1, "127.0.0.1:1")
    got = []
    for i, t in enumerate(seq):
        p.feed(0, samples.frame(1, struct.pack(">H", len(t)) + t + struct.pack(">II", 0, 1)
                                + b"v" + struct.pack(">i", -1)))
        if i % 1500 == 1499:
            got += [r for tb in src.drain() for r in tb.column("resource").to_pylist()]
    got += [r for tb in src.drain() for r in tb.column("resource").to_pylist()]
    want = {b"\xff\xfebad": "??bad", b"ab\xc3": "ab?", b"12345678\x80abcdefgh": "12345678?abcdefgh"}
    assert got == [want[t] if t in want else t.decode() for t in seq]


def test_resource_and_attrs_round_trip_with_invalid_utf8(tmp_path):
    """set_resource/add_attr bytes reach the file; invalid UTF-8 never makes it unreadable."""
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    from tests.probe_build import probe_module
    probe = probe_module()
    stats = _framing.RouteStats("probe", "probe")
    p = probe.ResourceProbe(stats)
    buf = _framing.FrameLogBuffer(2, 8)
    fl = FrameLog(str(tmp_path), "proxy", flush_interval=0.05)
    src = fl.add_source(make_source(buf, "r"))
    p.conn_id = 1
    p.attach_log(buf, buf.add_route(stats))
    src.connection(1, "[::1]:5")
    traced = []
    p.tracer = traced.append
    p.frame(b"orders", [(b"FROM_SERVICE", b"svc-a"), (b"k", b"")])
    p.frame(b"bad\xff\xfe\xc3", [(b"key\x80", b"v\xe2\x82")])
    p.frame(None, [])
    p.frame("é".encode() * 200, [])            # 400 bytes: kept up to 256
    fl.close()
    rows = read_rows(str(tmp_path))
    assert [r["resource"] for r in rows] == ["orders", "bad???", None,
                                             "é" * 128]
    assert rows[0]["attrs"] == [("FROM_SERVICE", "svc-a"), ("k", "")]
    assert rows[1]["attrs"] == [("key?", "v??")]
    assert rows[2]["attrs"] is None
    assert traced[0]["resource"] == "orders"
    assert traced[0]["attrs"] == {"FROM_SERVICE": "svc-a", "k": ""}


# ---- files -----------------------------------------------------------------------------

def test_file_names_temp_names_and_rotation(tmp_path):
    finished = []
    sink = FileSink(str(tmp_path), "client", "parquet", rotate_bytes=1 << 30,
                    rotate_seconds=3600, on_finished=lambda p, rows: finished.append((p, rows)))
    buf = RowBuffer(defaults={"source": "client", "route": "a"})
    for i in range(10):
        buf.append({"ts_ns": i, "correlation_id": str(i)})
    sink.write(buf.drain()[0])
    visible = os.listdir(tmp_path)
    assert len(visible) == 1 and visible[0].startswith(".") and visible[0].endswith(".tmp")
    sink.finish()
    name = os.path.basename(finished[0][0])
    stem = file_stem("client", time.time())
    host_pid = stem.rsplit("-", 1)[0]
    assert name.startswith(host_pid) and name.endswith("-000001.parquet"), name
    assert finished[0][1] == {"a": 10}
    assert sorted(os.listdir(tmp_path)) == [name]
    # size rotation: a tiny limit finishes a file per batch
    sink.rotate_bytes = 1
    for _ in range(3):
        buf.append({"ts_ns": 1})
        sink.write(buf.drain()[0])
    assert len(finished) == 4
    assert sorted(os.path.basename(p)[-14:] for p, _ in finished) == [
        "000001.parquet", "000002.parquet", "000003.parquet", "000004.parquet"]
    # age rotation
    sink.rotate_bytes, sink.rotate_seconds = 1 << 30, 0.01
    buf.append({"ts_ns": 2})
    sink.write(buf.drain()[0])
    time.sleep(0.02)
    sink.maybe_rotate()
    assert len(finished) == 5
    assert pq.read_table(finished[-1][0]).schema.equals(SCHEMA)


def test_two_writers_in_one_directory_never_collide(tmp_path):
    logs = [FrameLog(str(tmp_path), "client", flush_interval=0.01) for _ in range(2)]
    for i, fl in enumerate(logs):
        fl.sink.stem += "-w%d" % i            # two processes differ by pid; here by hand
        buf = fl.add_source(RowBuffer(defaults={"route": "r%d" % i}))
        fl.start()
        for j in range(100):
            buf.append({"ts_ns": j})
    for fl in logs:
        fl.close()
    rows = read_rows(str(tmp_path))
    assert len(rows) == 200 and len(os.listdir(tmp_path)) == 2


# ---- faults ----------------------------------------------------------------------------

def test_full_buffer_drops_and_counts_without_blocking():
    buf = RowBuffer(limit=10)
    fl = FrameLog("/nonexistent-never-written", "client")
    fl.add_source(buf)
    t0 = time.perf_counter()
    for i in range(1000):
        buf.append({"route": "r", "ts_ns": i})
    assert time.perf_counter() - t0 < 1.0
    assert len(buf.rows) == 10
    assert fl.dropped() == {"r": 990}


def test_unwritable_directory_counts_errors_and_recovers(tmp_path):
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the directory should be")
    buf = RowBuffer(defaults={"route": "r"})
    fl = FrameLog(str(blocker), "proxy", flush_interval=0.02)
    fl.add_source(buf)
    fl.start()
    for i in range(50):
        buf.append({"ts_ns": i})
    deadline = time.time() + 5
    while fl.write_errors == 0 and time.time() < deadline:
        time.sleep(0.01)
    assert fl.write_errors >= 1
    assert fl.dropped() == {"r": 50}
    blocker.unlink()                           # the disk "recovers"
    for i in range(20):
        buf.append({"ts_ns": i})
    fl.close()
    assert fl.records == {"r": 20} and len(read_rows(str(blocker))) == 20
    assert not [n for n in os.listdir(blocker) if n.startswith(".")]


def test_native_buffer_full_drops_per_route_and_recovers():
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    pkg = "flymq"
    impl = [i for i in impls(pkg) if i[0] == "c"][0]
    stats = impl[1]("fly", "flymq")
    parser = impl[2](stats)
    buf = _framing.FrameLogBuffer(2, 4)
    parser.attach_log(buf, buf.add_route(stats))
    conv = next(c for c in PROTOCOLS[pkg].conversations() if c.records)
    for _ in range(10):
        for d, data in conv.bursts():
            parser.feed(d, data)
    appended = buf.appended_counts()["fly"]
    dropped = buf.dropped_counts()["fly"]
    assert appended == 8 and dropped > 0      # two chunks of four, nothing more held
    while (i := buf.take()) >= 0:
        buf.release(i)
    parser.feed(*conv.bursts()[0])
    assert buf.appended_counts()["fly"] > 8    # room again after the writer caught up


@pytest.mark.parametrize("pkg", ["rabbitmq_stream", "fleximq"])
def test_native_chunks_batched_into_one_table_equal_chunk_by_chunk(tmp_path, pkg):
    """columns() over several chunks (the writer's larger row groups) gives the rows
    chunk-by-chunk drains give, in the same order; a drain woken by a full chunk
    (partial=False) leaves the chunk being filled for later; the columns native records
    always fill are required in the file, and the file reads back with SCHEMA."""
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    label, RouteStats, Parser = [i for i in impls(pkg) if i[0] == "c"][0]
    conv = next(c for c in PROTOCOLS[pkg].conversations() if c.records)

    def filled():
        stats = RouteStats("r", SPECS[pkg].name)
        parser = Parser(stats, options=dict(conv.options or {}))
        parser.conn_id = 7
        buf = _framing.FrameLogBuffer(64, 5)
        parser.attach_log(buf, buf.add_route(stats))
        for _ in range(6):
            for d, data in conv.bursts():
                parser.feed(d, data)
        src = make_source(buf, "run-b")
        src.connection(7, "10.0.0.1:1")
        return buf, src

    buf1, one = filled()
    one.batch_chunks = 1
    buf3, three = filled()
    three.batch_chunks = 3
    held = buf3.appended_counts()["r"] % 5           # records in the chunk being filled
    three.forget(7)                                  # closed: its last rows are still held
    full_tables = three.drain_full()
    assert three.peers == {7: "10.0.0.1:1"}          # ... so its peer stays for them
    assert [t.num_rows for t in full_tables[:-1]] == [15] * (len(full_tables) - 1)
    rest = three.drain(partial=True)
    assert sum(t.num_rows for t in rest) == held and len(rest) == (1 if held else 0)
    assert three.peers == {} and all(r["peer"] == "10.0.0.1:1"
                                     for t in full_tables + rest for r in t.to_pylist())
    singles = one.drain()
    assert len(singles) > len(full_tables) > 1
    def strip(tables):                                # times differ between the two fills
        return [dict(r, ts_ns=None, latency_ns=r["latency_ns"] is not None)
                for t in tables for r in t.to_pylist()]
    assert strip(full_tables + rest) == strip(singles)
    sink = FileSink(str(tmp_path), "proxy", "parquet")
    for table in full_tables + rest:
        sink.write(table)
    sink.finish()
    (path,) = glob.glob(os.path.join(tmp_path, "*.parquet"))
    schema = pq.ParquetFile(path).schema
    from proxy.framelog_native import REQUIRED
    leaves = {schema.column(k).path: schema.column(k) for k in range(len(schema))}
    for name in COLUMNS:
        if name != "attrs":
            assert (leaves[name].max_definition_level == 0) == (name in REQUIRED), name
    from proxy.framelog import DELTA_COLUMNS
    meta = pq.ParquetFile(path).metadata
    encodings = {meta.row_group(0).column(k).path_in_schema:
                 set(meta.row_group(0).column(k).encodings) for k in range(meta.num_columns)}
    for name in DELTA_COLUMNS:    # the writer's cheap integer encoding, one Spark 3.5 reads
        assert "DELTA_BINARY_PACKED" in encodings[name], (name, encodings[name])
    back = pq.read_table(path)
    assert back.schema.names == list(COLUMNS)
    assert [f.type for f in back.schema] == [f.type for f in SCHEMA]
    assert back.num_rows == sum(t.num_rows for t in singles)


def test_a_writer_woken_by_a_full_chunk_leaves_the_filling_one_for_later(tmp_path):
    """Woken by a full chunk, the writer writes full chunks only (a part-filled chunk
    would make a small row group); the rest goes at the flush interval or on close."""
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    label, RouteStats, Parser = [i for i in impls("flymq") if i[0] == "c"][0]
    conv = next(c for c in PROTOCOLS["flymq"].conversations() if len(c.records) >= 3)

    def feed(buf):
        stats = RouteStats("fly", "flymq")
        parser = Parser(stats, options=dict(conv.options or {}))
        parser.attach_log(buf, buf.add_route(stats))
        for d, data in conv.bursts():
            parser.feed(d, data)
        return buf.appended_counts()["fly"]

    total = feed(_framing.FrameLogBuffer(2, 1024))
    buf = _framing.FrameLogBuffer(4, total - 1)       # one full chunk + one record
    fl = FrameLog(str(tmp_path), "proxy", "parquet", flush_interval=3600)
    fl.add_source(make_source(buf, "w"))
    buf.wake = fl.wake
    assert feed(buf) == total and fl.wake.is_set()
    fl.start()
    deadline = time.monotonic() + 10
    while fl.sink._rows.get("fly", 0) < total - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert fl.sink._rows == {"fly": total - 1}        # the filling chunk stayed
    fl.close()
    rows = read_rows(str(tmp_path))
    assert fl.records == {"fly": total} and len(rows) == total and fl.write_errors == 0
    assert {r["peer"] for r in rows} == {None}        # a peer never registered: null rows


def test_columns_sized_from_the_arena_alone_in_reused_regions(tmp_path):
    """columns() sizes its string buffers from the chunks' arena bytes, without a pass
    over the records: a batch at those bounds - attrs of empty pairs (4 arena bytes a
    pair, the most pairs an arena can hold), long string ids, resources - comes out
    whole.  Its buffers are one block the next batch reuses once no Arrow buffer holds
    it, and never while one does: two tables alive at once keep their own rows."""
    if not HAVE_C:
        pytest.skip("compiled extensions not built (FRAMETAP_NO_EXTENSIONS)")
    import gc
    from tests.probe_build import probe_module
    probe = probe_module()
    buf = _framing.FrameLogBuffer(8, 160)
    stats = _framing.RouteStats("probe", "probe")
    route = buf.add_route(stats)
    res = probe.ResourceProbe(stats)
    res.conn_id = 1
    res.attach_log(buf, route)
    corr = probe.CorrProbe(_framing.RouteStats("probe", "probe"))
    corr.conn_id = 2
    corr.attach_log(buf, route)
    src = make_source(buf, "run-arena")
    src.connection(1, "10.0.0.1:1")
    src.connection(2, "10.0.0.1:2")

    def batch(tag):
        for i in range(40):
            res.frame(None, [(b"", b"")] * 60)
            ident = b"%s%03d-" % (tag, i) + b"x" * 120
            corr.request(0, i, ident)
            corr.response(1, i, ident)
            res.frame(b"%s-topic-%d" % (tag, i % 3), [])
        tables = src.drain()
        assert [t.num_rows for t in tables] == [160]
        return tables[0]

    def check(table, tag):
        rows = table.to_pylist()
        assert [r["attrs"] for r in rows[0::4]] == [[("", "")] * 60] * 40
        ids = ["%s%03d-" % (tag, i) + "x" * 120 for i in range(40)]
        assert [r["correlation_id"] for r in rows[1::4]] == ids
        assert [r["correlation_id"] for r in rows[2::4]] == ids
        assert [r["resource"] for r in rows[3::4]] == ["%s-topic-%d" % (tag, i % 3)
                                                       for i in range(40)]
        assert {r["peer"] for r in rows} == {"10.0.0.1:1", "10.0.0.1:2"}

    first = batch(b"a")
    second = batch(b"b")                 # the first table still holds its block
    check(first, "a")
    check(second, "b")
    assert [r.exports for r in buf.regions] == [1, 1]
    del first, second
    gc.collect()
    assert [r.exports for r in buf.regions] == [0, 0]
    third = batch(b"c")                  # a free block again: no third one
    check(third, "c")
    assert len(buf.regions) == 2 and sorted(r.exports for r in buf.regions) == [0, 1]
