"""The test suite's helpers, one way to do each thing:

========================  ===========================================================
a proxy, in-process       ``tests.support.start_proxy`` (a ProxyApp on the test's loop)
a proxy, as a process     :func:`proxy_process` (``frametap proxy --ready-file``)
a reference server        ``loadgen.<protocol>.server.*Thread`` in-process, or
                          :func:`server_process` (``frametap serve P --ready-file``)
a Locust run              :func:`run_locust` (headless, ``--json`` read strictly;
                          ``processes=N``); :func:`start_locust` in the background
                          (ports from its ready file), :func:`start_locust_master` /
                          :func:`start_locust_worker` for a distributed run
Prometheus                :func:`start_prometheus` (binds port 0, reads its log)
an event loop             ``tests.support.run()``, ``tests.conftest.LoopThread``:
                          unexpected loop errors fail the test (:mod:`.loopcheck`)
a port                    bind 0 and ask; :func:`free_port` + :func:`retry_on_collision`
                          only for programs that cannot (see :mod:`.ports`)
========================  ===========================================================
"""

from tests._support.locust import (LOCUST, LocustProcess, LocustRun, csv_stats, json_stats,
                                   locust_cmd, locust_env, run_locust, start_locust,
                                   start_locust_master, start_locust_worker)
from tests._support.ports import PortCollision, collided, free_port, retry_on_collision
from tests._support.processes import (FRAMETAP, ROOT, ProxyProcess, ReadyProcess,
                                      ServerProcess, frametap_env, host_port, proxy_process,
                                      read_to_eof, server_process, stop_process)
from tests._support.prometheus import start_prometheus

__all__ = ["LOCUST", "LocustProcess", "LocustRun", "csv_stats", "json_stats", "locust_cmd",
           "locust_env", "run_locust", "start_locust", "start_locust_master",
           "start_locust_worker", "PortCollision", "collided", "free_port", "retry_on_collision",
           "FRAMETAP", "ROOT", "ProxyProcess", "ReadyProcess", "ServerProcess", "frametap_env",
           "host_port", "proxy_process", "read_to_eof", "server_process", "stop_process",
           "start_prometheus"]
