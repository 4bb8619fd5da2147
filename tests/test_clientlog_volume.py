"""The client-side frame log keeps every row of a long Locust run, and writes during the
run (issue 20).  The writer used to die on its first wake-up (GeventFrameLog.flush()
lacked FrameLog's ``partial`` argument): each Locust process then held its rows until
exit and dropped everything past the buffer's 65,536, while the older tests only
counted the final flush of short runs.

One Locust process (the limit is per process) drives FlyMQ producers without think time
(tests/locustfile_fast.py) against the reference server in a process of its own.
"""

import glob
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from tests._support import ROOT, json_stats, locust_cmd, locust_env, server_process

pytestmark = pytest.mark.slow

#: no think time: FlyMQ producers as fast as one process can go
FAST_LOCUSTFILE = [sys.executable, "-m", "locust", "-f", "tests/locustfile_fast.py"]
BUFFER_LIMIT = 65536          # ClientLog's RowBuffer limit per process


@pytest.fixture
def flymq_server(tmp_path):
    """The reference FlyMQ server in a process of its own, on port 0 (its ready file)."""
    with server_process(tmp_path / "server", "flymq", "--retention-messages", "1000") as srv:
        yield srv.address


def locust(host, framelog, duration, fmt="parquet", users=16, stop_after=0):
    cmd = locust_cmd(host, ["FastProducer"], users, duration, entry=FAST_LOCUSTFILE,
                     args=["--frametap-framelog", str(framelog),
                           "--frametap-framelog-format", fmt])
    env = locust_env("flymq", {"FRAMETAP_FLYMQ_MESSAGE_SIZE": "16",
                               "FRAMETAP_TEST_STOP_AFTER": str(stop_after)})
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def locust_requests(stdout):
    return {e["name"]: e["num_requests"] for e in json_stats(stdout)}


def file_rows(directory):
    """Rows of the finished files (hidden temporary files are not finished)."""
    rows = 0
    for path in glob.glob(os.path.join(directory, "*.parquet")):
        rows += pq.read_metadata(path).num_rows
    for path in glob.glob(os.path.join(directory, "*.jsonl")):
        with open(path, "rb") as f:
            rows += sum(1 for line in f if line.strip())
    return rows


def test_a_run_past_the_buffer_limit_keeps_every_row(tmp_path, flymq_server):
    log = tmp_path / "log"
    proc = locust(flymq_server, log, "180s", stop_after=BUFFER_LIMIT + 4000)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    counts = locust_requests(out)
    requests = sum(counts.values())
    rows = file_rows(log)
    print(f"Locust requests {requests:,} ({counts}); client frame-log rows {rows:,}")
    assert requests > BUFFER_LIMIT
    assert rows == requests, (rows, requests, err[-2000:])
    assert not [n for n in os.listdir(log) if n.startswith(".")]
    assert "dropped" not in err, err[-2000:]


def test_rows_reach_the_disk_during_the_run(tmp_path, flymq_server):
    """The writer runs while the users do: the open file (JSON Lines, readable while it is
    written) holds rows long before the run ends, and more as it goes on."""
    log = tmp_path / "log"
    proc = locust(flymq_server, log, "10s", fmt="jsonl", users=4)
    seen = []
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and len(seen) < 2:
            time.sleep(0.5)
            lines = 0
            for path in glob.glob(os.path.join(log, ".*.jsonl.tmp")):
                try:
                    with open(path, "rb") as f:
                        lines += f.read().count(b"\n")
                except FileNotFoundError:
                    pass
            if lines and (not seen or lines > seen[-1][1]):
                seen.append((time.monotonic(), lines, proc.poll() is None))
                time.sleep(1.5)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert len(seen) == 2 and all(running for _, _, running in seen), seen
    assert seen[1][1] > seen[0][1] > 0, seen          # written, and growing, mid-run
    assert file_rows(log) == sum(locust_requests(out).values())
