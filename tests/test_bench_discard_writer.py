"""bench/discard_writer.py (run_bench's ``framelog0``): the proxy records every frame into
the frame-log buffer as with a real frame log, its writer gives the chunks back unwritten,
and the count it prints at exit is the rows the event loop recorded."""

import sys

from loadgen.flymq.client import FlyMQClient
from loadgen.flymq.server import FlyMQServerThread
from proxy.protocols.flymq.codec import ProduceRequest, encode_frame
from tests._support.processes import ROOT, ProxyProcess

sys.path.insert(0, str(ROOT / "bench"))
from discard_writer import discarded  # noqa: E402

DISCARD = ROOT / "bench" / "discard_writer.py"


def test_every_frame_is_recorded_and_no_file_is_written(tmp_path):
    server = FlyMQServerThread().start()
    logs = tmp_path / "logs"
    cfg = tmp_path / "proxy.toml"
    cfg.write_text(f'[framelog]\ndir = "{logs}"\n[[routes]]\nname = "fly"\n'
                   f'protocol = "flymq"\nlisten = "127.0.0.1:0"\n'
                   f'upstream = "{server.address}"\n')
    proxy = ProxyProcess([sys.executable, str(DISCARD), "proxy", "-c", str(cfg)],
                         tmp_path, "discard")
    try:
        client = FlyMQClient("127.0.0.1", proxy.port())
        client.create_topic("t", 1)                       # 2 rows
        request = ProduceRequest("t", b"v" * 8)
        frame = encode_frame(request.OPCODE, request.encode())
        client._sock.sendall(frame * 300)                 # pipelined: 600 rows
        for _ in range(300):
            assert client._read_frame().opcode == 0x01    # PRODUCE answered
        client.close()
    finally:
        status = proxy.stop()
        server.stop()
    text = proxy.log_text()
    assert status == 0, text[-2000:]
    assert text.count("frame log discarded") == 1, text[-2000:]
    assert discarded(text.encode()) == 602, text[-2000:]
    assert not list(logs.glob("*.parquet")) and not list(logs.glob(".*.tmp")), \
        sorted(p.name for p in logs.iterdir())
