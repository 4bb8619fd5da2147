"""Runs a whole proxy: every route's listener, the admin endpoint, graceful shutdown."""

import asyncio
import gc
import os
import errno
import logging
import resource
import signal

from proxy import websocket
from proxy.acceptor import FdReserve
from proxy.addresses import UnixAddress, format_address
from proxy.admin import AdminServer
from proxy.errors import ConfigError
from proxy.framing import set_pending_budget
from proxy.metrics import Exposition
from proxy.relay import Route

log = logging.getLogger("frametap")

FD_HEADROOM = 64      # descriptors kept for the admin endpoint, the frame log, logging


def raise_fd_limit():
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (a default shell gives
    1024, which holds ~500 proxied connections); returns the soft limit in force."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return None
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft


def connection_capacity(fd_limit):
    """Proxied connections the fd limit allows: two descriptors each, plus headroom."""
    return max(0, (fd_limit - FD_HEADROOM) // 2)


def check_framelog_dir(directory, key):
    """An unusable frame-log directory (a file, unwritable) is a configuration error:
    one line naming the key and exit 2, rather than a proxy that drops every row."""
    from proxy.framelog import unusable_directory
    why = unusable_directory(directory)
    if why is not None:
        raise ConfigError(f"{key}{' ' if key.startswith('--') else ' = '}'{directory}': {why}")


def start_framelog(cfg, routes):
    """The proxy's frame log (docs/design.md, "Frame log"): one native buffer shared by
    every route with ``framelog = true``, drained by a writer thread."""
    from proxy.framelog import FrameLog, new_run_id
    from proxy.framelog_native import make_source
    from proxy.framing import FrameLogBuffer
    chunks = 8
    buffer = FrameLogBuffer(chunks, max(256, cfg.buffer_records // chunks))
    framelog = FrameLog(cfg.dir, "proxy", cfg.format, cfg.rotate_bytes, cfg.rotate_seconds)
    source = framelog.add_source(make_source(buffer, cfg.run_id or new_run_id()))
    buffer.wake = framelog.wake
    # the writer wakes when a quarter of the buffer is full, not every chunk: a row
    # group of two chunks costs ~10% less per row, three quarters stay free for the relay
    buffer.wake_at = max(1, chunks // 4)
    try:
        os.makedirs(cfg.dir, exist_ok=True)
    except OSError as exc:             # not fatal: the writer retries, drops are counted
        log.warning("frame log: cannot create %s (%s); records are dropped until it can be "
                    "written", cfg.dir, exc.strerror or exc)
    for route in routes:
        if route.cfg.framelog:
            route.log_to(buffer, buffer.add_route(route.stats), source, cfg.sample)
    log.info("frame log: %s files in %s (run id %s, sample %g)", cfg.format, cfg.dir,
             source.run_id, cfg.sample)
    return framelog.start()


class ProxyApp:
    """Start with ``await app.start()``; stop with ``app.request_stop()`` or SIGTERM/SIGINT."""

    def __init__(self, config, ready_file=None):
        self.config = config
        self.ready_file = ready_file   # --ready-file: bound addresses, once listening
        self.routes = []
        self.admin = None
        self.ready = False
        self._stop = None
        self._force = None
        self.framelog = None           # proxy.framelog.FrameLog when [framelog] is set
        self.runinfo = None            # proxy.runinfo.RunInfo beside the frame logs
        self.reserve = None            # descriptors kept for /metrics at the fd limit
        self.api = None                # proxy.api.ApiServer when [toxiproxy] listen is set
        self.disabled = {}             # route name -> its bound address, while disabled

    async def start(self):
        if self.config.framelog is not None:   # refused before anything is bound
            check_framelog_dir(self.config.framelog.dir, self._key("framelog.dir"))
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._force = asyncio.Event()
        set_pending_budget(getattr(self.config, "max_pending_bytes", 256 << 20))
        fd_limit = raise_fd_limit()
        self.reserve = FdReserve()
        self.reserve.fill()
        self.routes = [Route(rc, loop, self.reserve) for rc in self.config.routes]
        for route in self.routes:          # faults: one engine per route, [proxy] seed
            route.start_faults(getattr(self.config, "seed", None))
        if fd_limit is not None:
            wanted = sum(rc.max_connections for rc in self.config.routes)
            capacity = connection_capacity(fd_limit)
            if wanted > capacity:          # the default (10000 a route) often exceeds it
                log.info("max_connections add up to %d over all routes; the open-file limit "
                         "(%d) holds about %d proxied connections (raise it with ulimit -n "
                         "to reach more)", wanted, fd_limit, capacity)
        if self.config.admin_listen is not None:
            host, port = self.config.admin_listen
            self.admin = AdminServer(Exposition(lambda: self.routes, lambda: self.framelog),
                                     lambda: self.ready, host, port, self.reserve,
                                     getattr(self.config, "admin_max_connections", 64))
            await self._bind(self.admin.start(), self._key("admin.listen"), (host, port))
        if getattr(self.config, "toxiproxy_listen", None) is not None:
            from proxy.api import ApiServer
            self.api = ApiServer(self, *self.config.toxiproxy_listen)
            await self._bind(self.api.start(), self._key("toxiproxy.listen"),
                             self.config.toxiproxy_listen)
        for i, route in enumerate(self.routes):
            await self._bind(route.start(), self._key(f"routes[{i}].listen"), route.cfg.listen)
        self.ready = True
        for route in self.routes:
            log.info("route %s: %s on %s -> %s", route.cfg.name, route.cfg.protocol,
                     format_address(route.address), format_address(route.cfg.upstream))
        if self.admin is not None:
            log.info("admin: http://%s:%d/metrics", *self.admin.address)
        if self.ready_file is not None:
            await self._write_ready_file()
        if self.config.framelog is not None:
            self.framelog = start_framelog(self.config.framelog, self.routes)
            from proxy.runinfo import RunInfo, proxy_section
            self.runinfo = RunInfo(self.config.framelog.dir, "proxy",
                                   self.framelog.sources[0].run_id,
                                   proxy=proxy_section(self.config, self.routes)).write()
        # Everything built at start-up (modules, protocol tables, config) lives as long as
        # the process: out of the collector's sight, a full collection walks only what the
        # connections made (~10 ms of loop time per full pass before)
        gc.collect()
        gc.freeze()

    def bound_addresses(self):
        """What ``--ready-file`` holds: each route's listen address by route name and the
        admin endpoint's (None without one), as bound (a port 0 is the chosen port)."""
        return {"pid": os.getpid(),
                "routes": {r.cfg.name: _listen_text(r) for r in self.routes},
                "admin": None if self.admin is None else format_address(self.admin.address),
                "api": None if self.api is None else format_address(self.api.address)}

    async def _write_ready_file(self):
        from proxy.readyfile import write_ready_file
        try:
            write_ready_file(self.ready_file, self.bound_addresses())
        except OSError as exc:
            await self.close_listeners()
            if self.admin is not None:
                self.admin.close()
            raise ConfigError(f"--ready-file '{self.ready_file}': cannot write: "
                              f"{exc.strerror or exc}") from None

    def _key(self, key):
        """A config key as the user named it (a flag in single-route mode)."""
        name = getattr(self.config, "key_name", None)
        return name(key) if name else key

    async def _bind(self, coro, key, address):
        shown = format_address(address)
        try:
            await coro
        except OSError as exc:
            await self.close_listeners()
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"{key}{' ' if key.startswith('--') else ' = '}'{shown}': "
                                  "address already in use") from None
            raise ConfigError(f"{key}{' ' if key.startswith('--') else ' = '}'{shown}': "
                              f"cannot listen: {exc.strerror or exc}") from None

    # -- routes at run time (the Toxiproxy-compatible API, proxy/api.py) ---------------

    def route_named(self, name):
        """The running route called ``name``; KeyError otherwise."""
        for route in self.routes:
            if route.cfg.name == name:
                return route
        raise KeyError(name)

    def route_enabled(self, route):
        return route.cfg.name not in self.disabled

    async def add_route(self, cfg):
        """Start a route given a RouteConfig (its faults in ``cfg.faults``) and list it
        once it listens. ValueError when the name is taken, OSError when it cannot
        listen (nothing is left half started)."""
        if any(r.cfg.name == cfg.name for r in self.routes):
            raise ValueError(f"route {cfg.name!r} exists already")
        route = Route(cfg, asyncio.get_running_loop(), self.reserve)
        start_faults = getattr(route, "start_faults", None)    # the fault engine, when in
        if start_faults is not None:
            start_faults(getattr(self.config, "seed", None))
        try:
            await route.start()
        except BaseException:
            await self._stop_route(route)
            raise
        self.routes.append(route)
        log.info("route %s: %s on %s -> %s (added through the API)", cfg.name, cfg.protocol,
                 format_address(route.address), format_address(cfg.upstream))
        return route

    async def remove_route(self, name):
        """Stop route ``name``: its listener, then its connections (closed, as Toxiproxy
        closes a deleted proxy's). KeyError when there is none."""
        route = self.route_named(name)
        self.routes.remove(route)
        self.disabled.pop(name, None)
        await self._stop_route(route)
        log.info("route %s: removed through the API", name)

    async def set_route_enabled(self, name, enabled):
        """Disable (stop listening, close its connections; Toxiproxy's enabled = false)
        or enable route ``name`` again, on the address it had (a port 0 keeps the port it
        got). OSError when it cannot listen again (it stays disabled)."""
        route = self.route_named(name)
        if enabled == self.route_enabled(route):
            return
        if not enabled:
            self.disabled[name] = route.address
            await self._stop_route(route)
            log.info("route %s: disabled through the API", name)
            return
        listen = self.disabled[name]
        if not isinstance(listen, UnixAddress):
            route.cfg.listen = tuple(listen)
        try:
            await route.start()
        except BaseException:
            await self._stop_route(route)
            raise
        del self.disabled[name]
        log.info("route %s: enabled through the API on %s", name, format_address(route.address))

    async def _stop_route(self, route):
        route.stop_accepting()
        route.acceptors = []
        for conn in list(route.connections):
            conn._finish(abort=False, by="proxy", reason="disabled")
        await route.drain(0)                  # the sweeper; aborts what did not close

    async def close_listeners(self):
        self.ready = False
        if self.api is not None:           # no routes added or faults changed from here
            await self.api.close()
        for route in self.routes:
            route.stop_accepting()

    def request_stop(self):
        """First call: graceful stop.  A second call (SIGTERM/Ctrl-C again) skips the drain."""
        if self._stop is None:
            return
        if self._stop.is_set():
            log.warning("second stop signal: closing open connections now")
            self._force.set()
        self._stop.set()

    async def wait_stopped(self):
        await self._stop.wait()

    async def shutdown(self, timeout=None):
        """Stop accepting, let open connections drain up to ``timeout``, then close."""
        timeout = self.config.shutdown_timeout if timeout is None else timeout
        await self.close_listeners()
        if self.ready_file is not None:    # no longer listening
            from proxy.readyfile import remove_ready_file
            remove_ready_file(self.ready_file)
        open_conns = sum(len(r.connections) for r in self.routes)
        if open_conns:
            log.info("draining %d open connections (up to %.1fs)", open_conns, timeout)
        await asyncio.gather(*(r.drain(timeout, self._force) for r in self.routes))
        if self.framelog is not None:      # after the drain: closing connections log too
            await asyncio.get_running_loop().run_in_executor(None, self.framelog.close)
            log.info("frame log: %d records in %d files in %s (%d dropped)",
                     sum(self.framelog.records.values()), self.framelog.files,
                     self.framelog.sink.directory, sum(self.framelog.dropped().values()))
        if self.runinfo is not None:
            self.runinfo.finish()
        if self.admin is not None:
            self.admin.close()
        if self.reserve is not None:
            self.reserve.close()

    async def run(self):
        """start(); wait for SIGTERM/SIGINT; shutdown()."""
        await self.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.wait_stopped()
        log.info("stopping: no new connections")
        await self.shutdown()


def _listen_text(route):
    """A route's bound listen address as its config takes it: ``ws://host:port/path``
    for a WebSocket route (the port as bound), ``host:port`` or ``unix:/path`` else."""
    listen = route.cfg.listen
    if isinstance(listen, websocket.WsAddress):
        return listen.url(port=route.address[1])
    return format_address(route.address)
