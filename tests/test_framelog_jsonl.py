"""The compiled JSON Lines writer (proxy/_jsonl.pyx; issue 19): the same bytes as the
Python writer it replaces (``json.dumps`` of each row of ``to_pylist()``), from every
column layout the writers produce - plain, dictionary-encoded, sliced, chunked, nulls,
escapes, non-ASCII, maps with duplicate keys - formatted without the GIL and without a
Python object per row, in time linear in the input."""

import os
import random
import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from proxy.framelog import SCHEMA, FileSink, jsonl_bytes_py

_jsonl = pytest.importorskip("proxy._jsonl")
if os.environ.get("FRAMETAP_NO_EXTENSIONS"):
    pytest.skip("compiled extensions not selected", allow_module_level=True)

ALPHABET = ["a", "Z", "é", "\u2028", "\x00", "\x1f", "\x7f", "\"", "\\", "\n", "\r", "\t",
            "\b", "\f", "😀", "中", "/", " ", "~", "\ud7ff", "\ue000", "\U0010ffff"]


def random_rows(n, seed=1):
    rng = random.Random(seed)

    def text():
        if rng.random() < 0.2:
            return None
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 9)))

    rows = []
    for _ in range(n):
        row = {}
        for field in SCHEMA:
            t = field.type
            if pa.types.is_integer(t):
                lim = 1 << (t.bit_width - 1)
                row[field.name] = None if rng.random() < 0.2 else rng.choice(
                    [0, -1, lim - 1, -lim, 7, rng.randrange(-lim, lim)])
            elif pa.types.is_map(t):
                row[field.name] = None if rng.random() < 0.3 else [
                    (rng.choice(["k", "j", "é", "x\n", ""]), text())
                    for _ in range(rng.randrange(0, 7))]
            else:
                row[field.name] = text()
        rows.append(row)
    return rows


def dictionary_encoded(table):
    cols = [pc.dictionary_encode(c) if pa.types.is_string(c.type) else c
            for c in table.columns]
    return pa.table(cols, names=table.column_names)


def test_same_bytes_as_the_python_writer_for_every_layout():
    table = pa.Table.from_pylist(random_rows(3000), schema=SCHEMA)
    layouts = {
        "plain": table,
        "dictionary": dictionary_encoded(table),
        "sliced": table.slice(17, 1000),
        "chunked": pa.concat_tables([table.slice(5, 100), table.slice(1000, 17),
                                     dictionary_encoded(table).slice(3, 50).cast(
                                         table.schema)]),
        "empty": table.slice(0, 0),
        "batch": table.to_batches()[0],
    }
    for name, t in layouts.items():
        want = jsonl_bytes_py(pa.Table.from_batches([t]) if name == "batch" else t) \
            if t.num_rows else b"\n"
        got = _jsonl.format_table(t)
        if not t.num_rows:
            assert got == b"", name
            continue
        assert got == want, name


def test_native_source_tables_match(tmp_path):
    """The proxy's own tables (NativeSource: dictionary columns with int8/int32 indices,
    required columns, maps from the arena) - through the real parsers' records."""
    from tests.test_framelog import HAVE_C
    if not HAVE_C:
        pytest.skip("compiled extensions not built")
    from proxy import _framing, protocols
    from proxy.framelog_native import NativeSource
    from proxy.protocols.flymq import samples
    stats = _framing.RouteStats("fly", "flymq")
    buf = _framing.FrameLogBuffer(8, 4096)
    parser = protocols.load("flymq").load_parser()(stats)
    parser.conn_id = 3
    parser.attach_log(buf, buf.add_route(stats))
    _, reqs, resps = samples.bench_frames(3000, 64)
    parser.feed(0, b"".join(reqs))
    parser.feed(1, b"".join(resps))
    src = NativeSource(buf, "run-j")
    src.connection(3, "[::1]:5000")
    tables = src.drain()
    assert sum(t.num_rows for t in tables) == 6000
    for t in tables:
        assert _jsonl.format_table(t) == jsonl_bytes_py(t)


def test_duplicate_map_keys_keep_first_place_last_value_in_linear_time():
    pairs = [("a", "1"), ("b", "2"), ("a", "3"), ("c", None), ("b", "5")]
    t = pa.table({"attrs": pa.array([pairs, None, []], pa.map_(pa.string(), pa.string()))})
    assert _jsonl.format_table(t) == jsonl_bytes_py(t) == \
        b'{"attrs":{"a":"3","b":"5","c":null}}\n{"attrs":null}\n{"attrs":{}}\n'
    # hostile: a row of 20,000 pairs (one key, then all distinct): linear, not quadratic
    many = pa.array([[("k", str(i)) for i in range(20000)],
                     [(str(i), "v") for i in range(20000)]],
                    pa.map_(pa.string(), pa.string()))
    t = pa.table({"attrs": many})
    t0 = time.process_time()
    got = _jsonl.format_table(t)
    assert time.process_time() - t0 < 0.5
    assert got == jsonl_bytes_py(t)


def test_other_column_types_fall_back_to_the_python_writer(tmp_path):
    from proxy.framelog import jsonl_bytes
    t = pa.table({"x": pa.array([1.5, None], pa.float64()), "s": ["a", "b"]})
    with pytest.raises(TypeError):
        _jsonl.format_table(t)
    assert jsonl_bytes(t) == jsonl_bytes_py(t)


def test_written_to_the_file_in_blocks_and_counted(tmp_path):
    table = pa.Table.from_pylist(random_rows(5000, seed=7), schema=SCHEMA)
    sink = FileSink(str(tmp_path), "proxy", "jsonl", rotate_bytes=1 << 40)
    sink.write(table)
    sink.write(table.slice(10, 20))
    path = sink.path
    sink.finish()
    with open(path, "rb") as f:
        assert f.read() == jsonl_bytes_py(table) + jsonl_bytes_py(table.slice(10, 20))
    with pytest.raises(OSError):
        _jsonl.write_table(table, os.open(os.devnull, os.O_RDONLY))   # EBADF: raised


@pytest.mark.slow
def test_formatting_releases_the_gil():
    """With a switch interval of 10 s a thread that held the GIL would stop this one for
    the whole formatting; the compiled writer lets it run meanwhile (the Python writer
    made one object per row under the GIL: 0.8 s relay stalls, issue 19)."""
    rows = random_rows(2000, seed=3)
    table = pa.Table.from_pylist(rows * 60, schema=SCHEMA)            # 120,000 rows
    fd = os.open(os.devnull, os.O_WRONLY)
    old = os.sys.getswitchinterval()
    ticks, done = [], threading.Event()

    def writer():
        try:
            for _ in range(3):
                _jsonl.write_table(table, fd)
        finally:
            done.set()
    try:
        os.sys.setswitchinterval(10.0)
        th = threading.Thread(target=writer)
        t0 = time.monotonic()
        th.start()
        while not done.is_set():
            time.sleep(0.001)
            ticks.append(time.monotonic())
        th.join()
        took = time.monotonic() - t0
    finally:
        os.sys.setswitchinterval(old)
        os.close(fd)
    assert took > 0.05, took                   # long enough to tell
    assert len(ticks) >= 10, (len(ticks), took)


def test_the_writer_is_imported_when_the_sink_is_made(tmp_path, monkeypatch):
    """A JSON Lines sink resolves its compiled writer when it is made, not at the first
    write: a child that dropped to another uid after start-up, in a checkout that uid
    cannot read (a clone under mktemp -d), counted every row as a write error."""
    from proxy import framelog
    monkeypatch.setattr(framelog, "_JSONL", None)
    FileSink(str(tmp_path), "proxy", "jsonl")
    resolved = framelog._JSONL                  # before anything else asks for it
    assert resolved is not None
    assert resolved is (False if os.environ.get("FRAMETAP_NO_EXTENSIONS")
                        else framelog._jsonl_native())
