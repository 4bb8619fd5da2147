from tests.test_websocket_through_proxy import counts, run_locust, stack  # noqa


def test_dbg(stack, tmp_path):
    app, lt, broker, url = stack
    run = run_locust("fleximq", url, users=6, duration="4s")
    stats = {name: e["num_requests"] for name, e in run.stats.items()}
    app.shutdown_once()
    c = counts(app, lt)
    if ("c2s", "JOIN") not in c[0] or "JOIN" not in stats:
        print("RC", run.returncode)
        print("STDERR", run.stderr[-6000:])
        print("STATS", run.stats)
        print("COUNTS", c)
        assert 0
