"""One frame-log writer under one disk fault, in a process of its own (run by
tests/test_framelog_faults.py; docs/design.md, "Frame log").

    python tests/framelog_faults_child.py SIDE FAULT DIR FORMAT [--as-nobody]

SIDE ``proxy``: the compiled proxy's path - a FlyMQ parser fills a native FrameLogBuffer
drained by NativeSource into a FrameLog.  SIDE ``client``: the Locust side - gevent's
monkey-patching as under Locust, ClientLog's GeventFrameLog fed through its request
listener (flushes in gevent's native thread pool).  Rows are produced in phases with the
fault in between; flushes are explicit (deterministic), as the writer thread's would be.

FAULT: ``deleted`` (the directory removed while a file is open), ``readonly`` (the
directory made read-only: needs a non-root user, hence ``--as-nobody`` which drops to
uid 65534 after the imports), ``full`` (DIR is a small tmpfs the parent mounted; a filler
file takes its last byte), ``exception`` (the encoder raises on a batch, a batch cannot
be converted, the writer loop itself raises).

Prints one JSON line: rows produced, records (in finished files), dropped, write errors,
files, and what each phase observed.
"""

import json
import os
import sys

SIDE, FAULT, DIR, FMT = sys.argv[1:5]
AS_NOBODY = "--as-nobody" in sys.argv

if SIDE == "client":
    from gevent import monkey
    monkey.patch_all()

import pyarrow.parquet as pq  # noqa: E402

import proxy.framelog as framelog_mod  # noqa: E402
from proxy.framelog import FrameLog  # noqa: E402

PHASE_PAIRS = 1000          # proxy: request/response pairs per phase (2 rows each)
PHASE_EVENTS = 2000         # client: request events per phase (1 row each)


class ProxySide:
    def __init__(self):
        from proxy import _framing, protocols
        from proxy.framelog_native import NativeSource
        from proxy.protocols.flymq import samples
        self.stats = _framing.RouteStats("fly0", "flymq")
        self.buf = _framing.FrameLogBuffer(64, 1024)
        route = self.buf.add_route(self.stats)
        self.parser = protocols.load("flymq").load_parser()(self.stats)
        self.parser.conn_id = 1
        self.parser.attach_log(self.buf, route)
        _, reqs, resps = samples.bench_frames(PHASE_PAIRS, 64)
        self.req, self.resp = b"".join(reqs), b"".join(resps)
        self.log = FrameLog(DIR, "proxy", FMT, flush_interval=3600)
        self.source = self.log.add_source(NativeSource(self.buf, "faults"))
        self.source.connection(1, "127.0.0.1:50000")

    def produce(self):
        self.parser.feed(0, self.req)
        self.parser.feed(1, self.resp)

    def produced(self):
        return (sum(self.buf.appended_counts().values())
                + sum(self.buf.dropped_counts().values()))

    def flush(self, finish=False):
        self.log.flush(finish)

    def close(self):
        self.log.close()

    def break_conversion(self):
        """The next batch's conversion to Arrow raises (a bug in NativeSource.table)."""
        real = type(self.source).table

        def table(src, cols):
            type(src).table = real
            raise RuntimeError("injected: conversion failed")
        type(self.source).table = table


class ClientSide:
    def __init__(self):
        from loadgen.clientlog import ClientLog
        self.client = ClientLog(DIR, run_id="faults", fmt=FMT, flush_interval=3600,
                                limit=1 << 20)
        self.log = self.client.framelog
        self.n = 0
        self.bad = False

    def produce(self):
        for _ in range(PHASE_EVENTS):
            self.n += 1
            ctx = {"frametap": {"conn_id": 1, "peer": "127.0.0.1:5000",
                                "correlation_id": str(self.n), "opcode": 1,
                                "opcode_name": "PRODUCE", "kind": "request",
                                "status": "OK", "messages": 1, "resource": "t"}}
            if self.bad:                  # a value the schema refuses (conn_id: int64)
                ctx["frametap"]["conn_id"] = "not a number"
                self.bad = False
            self.client.on_request("flymq", "PRODUCE", 1.5, 10, None, ctx)

    def produced(self):
        return self.n

    def flush(self, finish=False):
        self.log.flush(finish)            # GeventFrameLog: in gevent's thread pool

    def close(self):
        self.client.close()                   # what Locust's quit calls

    def break_conversion(self):
        self.bad = True


def disk_rows(directory):
    rows = 0
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name.endswith(".parquet") and not name.startswith("."):
            rows += pq.read_metadata(path).num_rows
        elif name.endswith(".jsonl") and not name.startswith("."):
            with open(path, "rb") as f:
                rows += sum(1 for line in f if line.strip())
    return rows


def main():
    side = ProxySide() if SIDE == "proxy" else ClientSide()
    if AS_NOBODY and os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    fl = side.log
    seen = {}

    def state():
        return {"write_errors": fl.write_errors, "dropped": sum(fl.dropped().values()),
                "records": sum(fl.records.values()), "produced": side.produced()}

    side.produce()
    side.flush()                               # phase 1: rows in the open file
    seen["phase1"] = state()
    if FAULT == "deleted":
        import shutil
        shutil.rmtree(DIR)
        side.produce()
        side.flush()                           # one flush: the lost file is noticed
        seen["after_one_flush"] = state()
        side.produce()
        side.flush()
    elif FAULT == "readonly":
        os.chmod(DIR, 0o555)
        side.produce()
        side.flush(finish=True)                # the rename fails: the file is lost
        seen["rename_failed"] = state()
        seen["stale_tmp"] = sorted(n for n in os.listdir(DIR) if n.endswith(".tmp"))
        side.produce()
        side.flush()                           # a new file cannot be created
        seen["open_failed"] = state()
        os.chmod(DIR, 0o755)
        side.produce()
        side.flush()                           # recovered; the stale file is removed
        seen["recovered"] = state()
        seen["tmp_after_recovery"] = sorted(n for n in os.listdir(DIR)
                                            if n.endswith(".tmp") and n not in
                                            {os.path.basename(fl.sink._tmp or "")})
    elif FAULT == "full":
        filler = os.path.join(DIR, "filler")
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
            try:                               # the last bytes, one at a time
                while True:
                    f.write(b"\0")
            except OSError:
                pass
        for _ in range(3):
            side.produce()
            side.flush()
        side.flush(finish=True)
        seen["while_full"] = state()
        os.unlink(filler)
        side.produce()
        side.flush()
    elif FAULT == "exception":
        import pyarrow.parquet as pq_mod
        real_write_table = pq_mod.ParquetWriter.write_table
        real_jsonl = framelog_mod.write_jsonl

        def failing_write_table(self, *a, **kw):
            pq_mod.ParquetWriter.write_table = real_write_table
            raise RuntimeError("injected: encoder failed")

        def failing_jsonl(file, table):
            framelog_mod.write_jsonl = real_jsonl
            raise RuntimeError("injected: encoder failed")
        if FMT == "parquet":
            pq_mod.ParquetWriter.write_table = failing_write_table
        else:
            framelog_mod.write_jsonl = failing_jsonl
        side.produce()
        side.flush()                           # the encoder raises: file + batch lost
        seen["encoder_failed"] = state()
        side.break_conversion()
        side.produce()
        side.flush()                           # the batch cannot be converted
        seen["conversion_failed"] = state()
        real_check = fl.sink.check

        def failing_check():
            fl.sink.check = real_check
            raise RuntimeError("injected: the writer loop failed")
        fl.sink.check = failing_check
        fl.flush_interval = 0.01
        fl.start()                             # the thread's flush raises once ...
        side.produce()
        import time
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and fl.sink.check is not real_check:
            time.sleep(0.01)
        time.sleep(0.1)
        seen["thread_alive_after_failure"] = fl._thread is not None and (
            fl._thread.is_alive() if hasattr(fl._thread, "is_alive") else True)
        side.produce()
    else:
        raise SystemExit("unknown fault " + FAULT)
    side.close()
    result = state()
    result.update(files=fl.files, seen=seen, disk_rows=disk_rows(DIR),
                  leftover=sorted(n for n in os.listdir(DIR) if n.startswith(".")))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
