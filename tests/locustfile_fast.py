"""A locustfile for the client frame-log volume tests (tests/test_clientlog_volume.py):
frametap's plugins and a FlyMQ producer without think time that sends its PRODUCEs in
bursts (less of Locust's scheduling per request), so that one Locust process passes the
client buffer's 65,536 rows within seconds.

``FRAMETAP_TEST_STOP_AFTER=N``: the run stops (``runner.quit()``) once N requests have
been reported, rather than after a fixed time on a machine of unknown speed.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import gevent  # noqa: E402
from locust import constant, events, task  # noqa: E402

from loadgen import plugins  # noqa: E402
from loadgen.flymq import users as _flymq  # noqa: E402

plugins.install()

BURST = 50


class FastProducer(_flymq.FlyMQProducer):
    """FlyMQProducer without think time, BURST PRODUCEs per task (and METADATA now and
    then, as the packaged user)."""

    wait_time = constant(0)
    tasks = []

    @task
    def burst(self):
        for _ in range(BURST):
            self.produce()


@events.init.add_listener
def _stop_after(environment, **_kwargs):
    limit = int(os.environ.get("FRAMETAP_TEST_STOP_AFTER") or 0)
    if not limit:
        return
    seen = [0]

    def on_request(**_kw):
        seen[0] += 1
        if seen[0] == limit and environment.runner is not None:
            gevent.spawn(environment.runner.quit)
    environment.events.request.add_listener(on_request)
