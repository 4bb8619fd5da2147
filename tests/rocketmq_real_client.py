"""Run Apache's real RocketMQ client (C++ ``librocketmq`` via PyPI's ``rocketmq``) in a subprocess.

Not a test module: tests import :func:`run_producer` / :func:`run_pull_consumer` and
:func:`real_client_skip_reason`. Each scenario runs in a child Python process because the
native client can crash (SIGSEGV on a malformed response) or hang (its own retry loops);
the child prints one JSON line, the parent enforces a timeout.

What is needed: PyPI's ``rocketmq`` 0.4.4 (``pip install rocketmq==0.4.4``; manylinux1
x86_64 wheel). It bundles ``rocketmq/librocketmq.so`` (rocketmq-client-cpp 1.x, static
boost/jsoncpp/libevent, plus ``rocketmq/.libs/libz-*.so``) and needs only the system's
libstdc++. ``rocketmq-client-python`` 2.0.0 (sdist only) ships no native library and
fails with ``ImportError: rocketmq dynamic library not found`` unless a librocketmq 2.x
is installed system-wide (released as .deb/.rpm on GitHub only, not on PyPI or Debian);
its Python code does not load 0.4.4's library (``undefined symbol:
CreateOrderlyProducer``). Both install the top-level package ``rocketmq``; use one.
The two spell the name-server setter differently (``set_namesrv_addr`` in 0.4.4,
``set_name_server_address`` in 2.x): the child accepts either.

What the 0.4.4 client puts on the wire (seen against a recording server): JSON headers
only (serialize type 0), ``language`` ``"CPP"``, ``version`` 63, ``length`` = 4 +
header + body (not counting itself), opaque counting from 0 per process. The producer
sends GET_ROUTEINFO_BY_TOPIC (105) to the name server, then SEND_MESSAGE (10, *not*
SEND_MESSAGE_V2) with long ext-field names (``producerGroup``, ``topic``, ``queueId``,
``sysFlag``, ``bornTimestamp``, ``flag``, ``properties``, ``reconsumeTimes``,
``unitMode``, ``batch``, ``defaultTopic`` ``TBW102``, ``defaultTopicQueueNums``) with
mixed JSON types (``queueId``, ``flag``, ``sysFlag``, ``defaultTopicQueueNums``
numbers; ``batch``, ``bornTimestamp``, ``reconsumeTimes``, ``unitMode`` strings), plus ``AccessKey``/``OnsChannel``/``Signature`` even without credentials;
``properties`` uses ``\\x01``/``\\x02`` separators and carries KEYS, TAGS, UNIQ_KEY and
WAIT. Queues are chosen round-robin; ``send_sync`` returns the UNIQ_KEY as ``msg_id``
and the broker's ``queueOffset`` as ``offset``. On shutdown it sends UNREGISTER_CLIENT
(35) with ``clientID`` ``<pid>-<ip>@DEFAULT`` (and empty ``consumerGroup``); HEART_BEAT
(34) comes from a 30 s timer, so a short run may or may not send one (seen right after
UNREGISTER_CLIENT): no ext fields but the credential trio, body = HeartbeatData JSON from
jsoncpp's FastWriter (trailing newline, ``producerDataSet`` only). The response parser
expects JSON headers and treats the header-length word as a plain length (a binary
response would break it); ``brokerAddrs`` keys may be bare (``{0:"h:p"}``).
The PullConsumer sends GET_ROUTEINFO_BY_TOPIC, then PULL_MESSAGE (11) per queue from
offset 0 with ``consumerGroup``, ``topic``, ``queueId``, ``queueOffset``,
``maxMsgNums`` 32, ``sysFlag`` 4 (subscription only: no suspend, no commit),
``commitOffset`` 0, ``suspendTimeoutMillis`` 20000, ``subscription`` ``*``,
``subVersion`` 0 (all string values), until PULL_NOT_FOUND; then UNREGISTER_CLIENT.
It sends no HEART_BEAT or UPDATE_CONSUMER_OFFSET in that scenario.

The native client logs under ``$HOME/logs/rocketmq-cpp``: the child runs with ``HOME``
set to a temporary directory, and the tail of that log is returned on failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

__all__ = ["real_client_skip_reason", "run_producer", "run_pull_consumer"]

_MARK = "FRAMETAP-REAL-CLIENT-RESULT "

# Child-side helpers shared by the scenarios (run with ``python -c``).
_PRELUDE = r'''
import json, sys, traceback
args = json.loads(sys.argv[1])
from rocketmq.client import Message
def set_namesrv(obj, address):
    setter = getattr(obj, "set_name_server_address", None) or getattr(obj, "set_namesrv_addr")
    setter(address)
def text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
def emit(result):
    sys.stdout.write("%s" + json.dumps(result) + "\n")
    sys.stdout.flush()
''' % _MARK

_PRODUCER = _PRELUDE + r'''
from rocketmq.client import Producer
result = {"sent": 0, "results": [], "errors": []}
producer = Producer(args["group"])
try:
    set_namesrv(producer, args["namesrv"])
    if args.get("send_timeout_ms"):
        producer.set_timeout(args["send_timeout_ms"])
    producer.start()
    for i in range(args["n"]):
        msg = Message(args["topic"])
        msg.set_keys("%s-%d" % (args["key_prefix"], i))
        msg.set_tags(args["tags"])
        for k, v in (args.get("properties") or {}).items():
            msg.set_property(k, v)
        msg.set_body(args["body"].replace("{i}", str(i)))
        try:
            r = producer.send_sync(msg)
        except Exception as exc:
            result["errors"].append("send %d: %s: %s" % (i, type(exc).__name__, exc))
            continue
        result["results"].append([getattr(r.status, "name", str(r.status)), r.msg_id, r.offset])
        if getattr(r.status, "value", r.status) == 0:
            result["sent"] += 1
except Exception as exc:
    result["errors"].append("%s: %s" % (type(exc).__name__, exc))
finally:
    try:
        producer.shutdown()
    except Exception as exc:
        result["errors"].append("shutdown: %s: %s" % (type(exc).__name__, exc))
    emit(result)
'''

_PULL_CONSUMER = _PRELUDE + r'''
from rocketmq.client import PullConsumer
result = {"received": 0, "messages": [], "errors": []}
consumer = PullConsumer(args["group"])
try:
    set_namesrv(consumer, args["namesrv"])
    consumer.start()
    for msg in consumer.pull(args["topic"], args["expression"], args["max_num"]):
        result["messages"].append({
            "queue_id": msg.queue_id, "offset": msg.queue_offset, "keys": text(msg.keys),
            "tags": text(msg.tags), "body": text(msg.body), "id": text(msg.id)})
        result["received"] += 1
        if result["received"] >= args["limit"]:
            break
except Exception as exc:
    result["errors"].append("%s: %s" % (type(exc).__name__, exc))
finally:
    try:
        consumer.shutdown()
    except Exception as exc:
        result["errors"].append("shutdown: %s: %s" % (type(exc).__name__, exc))
    emit(result)
'''

def real_client_skip_reason(python: str | None = None) -> str | None:
    """None when ``from rocketmq.client import Producer`` works (in a child process of
    ``python``, default this interpreter); otherwise why not (for ``pytest.skip``)."""
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", "from rocketmq.client import Producer, Message"],
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"real RocketMQ client: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"real RocketMQ client (pip install rocketmq==0.4.4) unusable: {last}"
    return None


def _run(script: str, args: dict, timeout: float, python: str | None) -> dict:
    home = tempfile.mkdtemp(prefix="frametap-rocketmq-client-")
    env = dict(os.environ, HOME=home)
    result: dict
    try:
        try:
            proc = subprocess.run([python or sys.executable, "-c", script, json.dumps(args)],
                                  capture_output=True, text=True, timeout=timeout, env=env,
                                  cwd=home)
            stdout, stderr, rc, timed_out = proc.stdout, proc.stderr, proc.returncode, False
        except subprocess.TimeoutExpired as exc:
            # subprocess.run kills the child on timeout
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            rc, timed_out = None, True
        result = None
        for line in stdout.splitlines():
            if line.startswith(_MARK):
                result = json.loads(line[len(_MARK):])
        if result is None:
            result = {"errors": ["child produced no result" + (" (timed out)" if timed_out
                                                                else f" (exit code {rc})")]}
        result.update(returncode=rc, timed_out=timed_out, stderr=stderr[-4000:])
        if result.get("errors") or rc != 0:
            result["client_log"] = _log_tail(home)
        return result
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _log_tail(home: str, limit: int = 4000) -> str:
    logdir = os.path.join(home, "logs", "rocketmq-cpp")
    text = ""
    try:
        for name in sorted(os.listdir(logdir)):
            with open(os.path.join(logdir, name), errors="replace") as f:
                text += f.read()
    except OSError:
        pass
    return text[-limit:]


def run_producer(namesrv_address: str, topic: str, n: int = 10, timeout: float = 60.0, *,
                 group: str = "PID-frametap-real", key_prefix: str = "key",
                 tags: str = "TagA", body: str = "frametap real-client message {i}",
                 properties: dict | None = None, send_timeout_ms: int | None = 3000,
                 python: str | None = None) -> dict:
    """Start a real ``rocketmq.client.Producer`` on ``namesrv_address`` ("host:port")
    and ``send_sync`` ``n`` messages to ``topic`` (keys ``<key_prefix>-<i>``, tag
    ``tags``, ``body`` with ``{i}`` replaced by the index), then shut it down.

    Returns ``dict(sent=<SEND_OK count>, results=[(status name, msg_id, offset)...],
    errors=[...], returncode, timed_out, stderr[, client_log])``; never raises for
    client failures (they are in ``errors``; a crash or hang shows in ``returncode`` /
    ``timed_out``).
    """
    return _run(_PRODUCER, {"namesrv": namesrv_address, "topic": topic, "n": int(n),
                            "group": group, "key_prefix": key_prefix, "tags": tags,
                            "body": body, "properties": properties or {},
                            "send_timeout_ms": send_timeout_ms}, timeout, python)


def run_pull_consumer(namesrv_address: str, topic: str, limit: int = 1000,
                      timeout: float = 60.0, *, group: str = "CID-frametap-real",
                      expression: str = "*", max_num: int = 32,
                      python: str | None = None) -> dict:
    """Start a real ``rocketmq.client.PullConsumer`` and pull every queue of ``topic``
    from offset 0 until the broker says NO_NEW_MSG (or ``limit`` messages).

    Returns ``dict(received=N, messages=[{queue_id, offset, keys, tags, body, id}...],
    errors=[...], returncode, timed_out, stderr[, client_log])``.
    """
    return _run(_PULL_CONSUMER, {"namesrv": namesrv_address, "topic": topic,
                                 "limit": int(limit), "group": group,
                                 "expression": expression, "max_num": int(max_num)},
                timeout, python)
