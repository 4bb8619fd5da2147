"""The fault HTTP API (docs/design.md, "Faults"): Toxiproxy 2.x's API, and frametap's own
endpoints for the opcode-aware rules, on one aiohttp listener (``[toxiproxy] listen``,
``frametap proxy --api HOST:PORT``; off unless set) served by the proxy's own loop.

Toxiproxy's paths, methods, status codes and bodies (Shopify/toxiproxy ``api.go``,
``proxy_collection.go``, ``toxic_collection.go``), so its published clients drive
frametap unchanged; every route of the proxy is one of its "proxies":

=======================================  ===================================================
``GET /proxies``                         ``{name: proxy}``; a proxy is ``{name, listen,
                                         upstream, enabled, toxics, frametap_protocol}``
``POST /proxies``                        create (201): a new route, undecoded TCP unless
                                         ``frametap_protocol`` names a protocol
``GET /proxies/{p}``                     the proxy
``POST|PATCH /proxies/{p}``              update ``listen`` / ``upstream`` / ``enabled``
``DELETE /proxies/{p}``                  remove the route (204)
``GET /proxies/{p}/toxics``              ``[toxic]`` (upstream ones first)
``POST /proxies/{p}/toxics``             add a toxic (200)
``GET /proxies/{p}/toxics/{t}``          the toxic
``POST|PATCH /proxies/{p}/toxics/{t}``   update its ``attributes`` (merged) / ``toxicity``
``DELETE /proxies/{p}/toxics/{t}``       remove it (204)
``POST /populate``                       create or replace proxies in bulk (201,
                                         ``{"proxies": [...]}``)
``POST /reset``                          enable every proxy, remove every toxic (204)
``GET /version``                         ``{"version": "2.12.0", "frametap": "..."}``
=======================================  ===================================================

frametap's own, the same JSON shape as ``[[routes.faults]]`` (proxy/faultspec.py):

=================================================  =====================================
``GET /api/v1/routes``                             every route with its rules and toxics
``GET /api/v1/routes/{route}``                     one route
``GET|POST|DELETE /api/v1/routes/{route}/faults``  list / add (201) / remove all (204)
``GET|PATCH|POST|DELETE .../faults/{name}``        one rule: show / update / remove (204)
=================================================  =====================================

Errors are ``{"error": "<one line>", "status": N}`` with that status: 400 bad input,
404 no such proxy / toxic / rule / path, 405 wrong method, 409 the name exists or the
address is in use, 413 a body over :data:`MAX_BODY`. As Toxiproxy does, requests whose
User-Agent starts with ``Mozilla/`` get 403 (a web page must not reach a local proxy's
control API with the browser's own requests).

Deliberate differences from Toxiproxy (docs/design.md "Faults"; README): a toxic's
unknown attribute, a negative value or a fraction where Toxiproxy wants an integer is a
400 instead of being ignored or zeroed; a slicer needs ``average_size`` >= 1 (Toxiproxy
recurses forever on 0); a listen address in use is 409 (Toxiproxy: 500).
"""

import asyncio
import errno
import json
import logging
import time

from aiohttp import web

from proxy.addresses import UnixAddress, format_address, parse_address
from proxy.errors import ConfigError, show_value
from proxy.relay import LogLimiter
from proxy.faultspec import MAX_NAME_CHARS, UNDECODED, FaultSpecError

log = logging.getLogger("frametap.api")

__all__ = ["ApiServer", "ApiError", "TOXIPROXY_VERSION", "MAX_BODY", "MAX_ROUTES"]

TOXIPROXY_VERSION = "2.12.0"     # the Toxiproxy API this one follows
MAX_BODY = 1 << 20               # bytes of a request body
MAX_ROUTES = 1024                # routes in all (each holds a listener)
PROXY_KEYS = ("name", "listen", "upstream", "enabled", "toxics", "frametap_protocol")
_SERVER = web.AppKey("frametap_api", object)       # the ApiServer, for the middleware


class ApiError(Exception):
    """An answer other than success: ``{"error": message, "status": status}``."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def _frametap_version():
    try:
        from importlib.metadata import version
        return version("frametap")
    except Exception:                 # a source tree that was never installed
        return "unknown"


def _json(data, status=200):
    return web.Response(text=json.dumps(data), status=status,
                        content_type="application/json")


def _error(status, message):
    return _json({"error": message, "status": status}, status)


@web.middleware
async def _errors(request, handler):
    """Every failure as Toxiproxy's error JSON, never a traceback to the client; each one
    counted (``ApiServer.refused``) and logged in one rate-limited line."""
    response = await _answer(request, handler)
    if response.status >= 400:
        server = request.app[_SERVER]
        server.refused[response.status] = server.refused.get(response.status, 0) + 1
        server.log.info("api: %s %s -> %d %s", request.method, request.path[:200],
                        response.status, (getattr(response, "text", "") or "").strip()[:300])
    return response


async def _answer(request, handler):
    if request.headers.get("User-Agent", "").startswith("Mozilla/"):
        return web.Response(status=403, text="User agent not allowed\n")
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc.status, exc.message)
    except FaultSpecError as exc:
        return _error(exc.status, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        text = {404: "not found", 405: "method not allowed"}.get(
            exc.status, (exc.reason or "error").lower())
        if exc.status == 404:
            text = f"not found: {request.method} {request.path}"
        elif exc.status == 405:
            text = f"method not allowed: {request.method} {request.path}"
        elif exc.status == 413:
            text = f"request body too large (at most {MAX_BODY} bytes)"
        return _error(exc.status, text)
    except asyncio.CancelledError:
        raise
    except Exception as exc:          # a bug here must not take the proxy down
        log.exception("api: %s %s failed", request.method, request.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


async def _body(request, default=None, expect=dict):
    """The request's JSON body (``default`` when empty): 400 "bad request body: ..." for
    anything else, as Toxiproxy words it."""
    raw = await request.read()
    if not raw.strip():
        if default is not None:
            return default
        raise ApiError(400, "bad request body: empty (expected a JSON object)")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"bad request body: {exc}") from None
    if not isinstance(data, expect):
        raise ApiError(400, f"bad request body: {show_value(data)} (expected a JSON "
                            f"{'object' if expect is dict else 'array'})")
    return data


def _parse_listen(text, key="listen"):
    if isinstance(text, str) and text.startswith(":"):     # Go's ":PORT": every interface
        text = "0.0.0.0" + text
    return parse_address(text, key, allow_port_zero=True)


#: open API connections at once; one more is answered 503 and closed (a test suite's
#: Toxiproxy client keeps one or a few; the cap stops a flood from holding the loop's
#: memory and descriptors that the relay needs)
MAX_CONNECTIONS = 128
#: a connection that sends nothing for this long is closed (aiohttp has a keep-alive
#: timeout between requests but none while a request's head trickles in)
IDLE_TIMEOUT = 30.0
_BUSY = json.dumps({"error": "too many API connections (%d open)" % MAX_CONNECTIONS,
                    "status": 503}).encode()
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(_BUSY)) + _BUSY


class _Capped(asyncio.Protocol):
    """One API connection: aiohttp's request handler behind a connection cap and an
    idle timeout, both counted and logged through the API's rate-limited log."""

    def __init__(self, api, handler_factory):
        self.api = api
        self.factory = handler_factory
        self.inner = None
        self.transport = None
        self.timer = None
        self.seen = 0.0

    def connection_made(self, transport):
        api = self.api
        if api.active >= MAX_CONNECTIONS:
            api.over_cap += 1
            api.log.info("api: connection refused: %d connections open (the cap); %d "
                         "refused so far", api.active, api.over_cap)
            transport.write(_BUSY_RESPONSE)
            transport.close()
            return
        api.active += 1
        self.transport = transport
        self.inner = self.factory()
        self.inner.connection_made(transport)
        self.seen = time.monotonic()
        self.timer = asyncio.get_running_loop().call_later(IDLE_TIMEOUT, self._idle)

    def _idle(self):
        self.timer = None
        if self.inner is None:
            return
        quiet = time.monotonic() - self.seen
        if quiet < IDLE_TIMEOUT:
            self.timer = asyncio.get_running_loop().call_later(IDLE_TIMEOUT - quiet,
                                                               self._idle)
            return
        self.api.idle_closed += 1
        self.transport.abort()

    def connection_lost(self, exc):
        if self.inner is None:
            return
        inner, self.inner = self.inner, None
        self.api.active -= 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        inner.connection_lost(exc)

    def data_received(self, data):
        if self.inner is not None:
            self.seen = time.monotonic()
            self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self):
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self):
        if self.inner is not None:
            self.inner.resume_writing()


class ApiServer:
    """The API of one running :class:`proxy.app.ProxyApp` (``app``): reads its routes
    and changes them through ``app.add_route`` / ``remove_route`` /
    ``set_route_enabled`` and each route's ``cfg.faults`` (a FaultSet)."""

    def __init__(self, app, host, port):
        self.app = app
        self.host, self.port = host, port
        self.runner = None
        self.lock = asyncio.Lock()      # one change at a time (a change may await a bind)
        self.refused = {}               # HTTP status -> requests answered with it (>= 400)
        self.listener = None            # the asyncio Server (start())
        self.active = 0                 # open API connections (_Capped)
        self.over_cap = 0               # connections refused at the cap (503)
        self.idle_closed = 0            # connections closed after IDLE_TIMEOUT silent
        # at most 10 lines a second, the rest summed up in one line
        self.log = LogLimiter(logger=log, level=logging.INFO, prefix="api", what="lines")

    # -- life cycle -----------------------------------------------------------------

    def make_app(self):
        a = web.Application(middlewares=[_errors], client_max_size=MAX_BODY)
        a[_SERVER] = self
        r = a.router
        r.add_post("/reset", self.reset)
        r.add_get("/proxies", self.proxy_index)
        r.add_post("/proxies", self.proxy_create)
        r.add_post("/populate", self.populate)
        r.add_get("/proxies/{proxy}", self.proxy_show)
        r.add_post("/proxies/{proxy}", self.proxy_update)
        r.add_patch("/proxies/{proxy}", self.proxy_update)
        r.add_delete("/proxies/{proxy}", self.proxy_delete)
        r.add_get("/proxies/{proxy}/toxics", self.toxic_index)
        r.add_post("/proxies/{proxy}/toxics", self.toxic_create)
        r.add_get("/proxies/{proxy}/toxics/{toxic}", self.toxic_show)
        r.add_post("/proxies/{proxy}/toxics/{toxic}", self.toxic_update)
        r.add_patch("/proxies/{proxy}/toxics/{toxic}", self.toxic_update)
        r.add_delete("/proxies/{proxy}/toxics/{toxic}", self.toxic_delete)
        r.add_get("/version", self.version)
        r.add_get("/api/v1/routes", self.route_index)
        r.add_get("/api/v1/routes/{route}", self.route_show)
        r.add_get("/api/v1/routes/{route}/faults", self.fault_index)
        r.add_post("/api/v1/routes/{route}/faults", self.fault_create)
        r.add_delete("/api/v1/routes/{route}/faults", self.fault_clear)
        r.add_get("/api/v1/routes/{route}/faults/{name}", self.fault_show)
        r.add_patch("/api/v1/routes/{route}/faults/{name}", self.fault_update)
        r.add_post("/api/v1/routes/{route}/faults/{name}", self.fault_update)
        r.add_delete("/api/v1/routes/{route}/faults/{name}", self.fault_delete)
        return a

    async def start(self):
        """Listen (OSError when it cannot: the app turns that into one line, exit 2).
        aiohttp serves each connection; :class:`_Capped` in front of it holds the
        connection cap and the idle timeout that aiohttp does not have."""
        self.runner = web.AppRunner(self.make_app(), handle_signals=False, access_log=None,
                                    shutdown_timeout=1.0)
        await self.runner.setup()
        handler = self.runner.server
        try:
            self.listener = await asyncio.get_running_loop().create_server(
                lambda: _Capped(self, handler), self.host, self.port, reuse_address=True,
                backlog=MAX_CONNECTIONS)
        except BaseException:
            await self.runner.cleanup()
            self.runner = None
            raise
        log.info("api: Toxiproxy-compatible and fault API on http://%s",
                 format_address(self.address))

    @property
    def address(self):
        """(host, port) bound (port 0 in the config picks a free one)."""
        return tuple(self.listener.sockets[0].getsockname()[:2])

    async def close(self):
        if self.listener is not None:
            self.listener.close()
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()

    # -- helpers --------------------------------------------------------------------

    def _route(self, name, what="proxy"):
        try:
            return self.app.route_named(name)
        except KeyError:
            raise ApiError(404, f"{what} not found: {name!r}" if what == "route" else
                           "proxy not found") from None

    def _listen_of(self, route):
        listen = self.app.disabled.get(route.cfg.name)
        return format_address(route.address if listen is None else listen)

    def proxy_json(self, route):
        """Toxiproxy's proxy JSON (plus ``frametap_protocol``)."""
        return {"name": route.cfg.name, "listen": self._listen_of(route),
                "upstream": format_address(route.cfg.upstream),
                "enabled": self.app.route_enabled(route),
                "toxics": [t.to_json() for t in route.cfg.faults.toxics()],
                "frametap_protocol": route.cfg.protocol}

    def route_json(self, route):
        return {"name": route.cfg.name, "protocol": route.cfg.protocol,
                "listen": self._listen_of(route),
                "upstream": format_address(route.cfg.upstream),
                "enabled": self.app.route_enabled(route),
                "faults": [r.to_json() for r in route.cfg.faults.rules()],
                "toxics": [t.to_json() for t in route.cfg.faults.toxics()]}

    def route_config(self, body, where=""):
        """A proxy JSON object -> RouteConfig; ApiError 400 naming the field."""
        for key in body:
            if key not in PROXY_KEYS:
                raise ApiError(400, f"bad request body: {where}unknown key {key!r} (expected "
                                    f"one of: {', '.join(PROXY_KEYS)})")
        for key in ("name", "upstream"):
            if not body.get(key):
                at = f" at {where.rstrip(': ')}" if where else ""
                raise ApiError(400, f"missing required field: {key}{at}")
        for key in ("name", "upstream", "listen", "frametap_protocol"):
            if key in body and not isinstance(body[key], str):
                raise ApiError(400, f"bad request body: {where}{key} = "
                                    f"{show_value(body[key])}: expected a string")
        if "enabled" in body and not isinstance(body["enabled"], bool):
            raise ApiError(400, f"bad request body: {where}enabled = "
                                f"{show_value(body['enabled'])}: expected true or false")
        name = body["name"]
        if len(name) > MAX_NAME_CHARS or not name.isprintable() or "/" in name:
            raise ApiError(400, f"{where}name = {show_value(name)}: expected at most "
                                f"{MAX_NAME_CHARS} printable characters and no '/'")
        listen = body.get("listen") or "127.0.0.1:0"
        protocol = body.get("frametap_protocol")
        from proxy.config import RouteConfig, route_from_table
        try:
            if protocol in (None, UNDECODED):
                return RouteConfig(name=name, protocol=UNDECODED,
                                   listen=_parse_listen(listen, f"{where}listen"),
                                   upstream=parse_address(body["upstream"],
                                                          f"{where}upstream"),
                                   framelog=False)
            table = {"name": name, "protocol": protocol, "upstream": body["upstream"],
                     "listen": "0.0.0.0" + listen if listen.startswith(":") else listen,
                     "framelog": False}
            names = {f"routes[0].{k}": f"{where}{k}" for k in ("name", "listen", "upstream")}
            names["routes[0].protocol"] = f"{where}frametap_protocol"
            return route_from_table(table, 0, names)
        except ConfigError as exc:
            raise ApiError(400, str(exc)) from None

    def _differs(self, route, cfg):
        """Toxiproxy's Proxy.Differs: another upstream, or a listen address other than
        the one bound (a port 0 always differs); here also another protocol."""
        current = self.app.disabled.get(route.cfg.name) or route.address
        if isinstance(cfg.listen, UnixAddress) or isinstance(current, UnixAddress):
            same_listen = cfg.listen == current
        else:
            same_listen = cfg.listen[1] != 0 and tuple(cfg.listen) == tuple(current[:2])
        return not (same_listen and cfg.upstream == route.cfg.upstream
                    and cfg.protocol == route.cfg.protocol)

    def _bind_error(self, exc, listen):
        shown = format_address(listen)
        if exc.errno == errno.EADDRINUSE:
            return ApiError(409, f"listen = '{shown}': address already in use")
        return ApiError(400, f"listen = '{shown}': cannot listen: {exc.strerror or exc}")

    async def _create(self, cfg, enabled):
        if any(r.cfg.name == cfg.name for r in self.app.routes):
            raise ApiError(409, "proxy already exists")
        if len(self.app.routes) >= MAX_ROUTES:
            raise ApiError(400, f"too many proxies (at most {MAX_ROUTES} routes)")
        try:
            route = await self.app.add_route(cfg)
        except OSError as exc:
            raise self._bind_error(exc, cfg.listen) from None
        if not enabled:
            await self.app.set_route_enabled(cfg.name, False)
        return route

    async def _update(self, route, body):
        """Toxiproxy's Proxy.Update: a new listen or upstream restarts the proxy (its
        connections close); ``enabled`` starts or stops it."""
        name = route.cfg.name
        listen, upstream = route.cfg.listen, route.cfg.upstream
        try:
            if "listen" in body:
                if not isinstance(body["listen"], str):
                    raise ApiError(400, f"bad request body: listen = "
                                        f"{show_value(body['listen'])}: expected a string")
                listen = _parse_listen(body["listen"])
            if "upstream" in body:
                if not isinstance(body["upstream"], str):
                    raise ApiError(400, f"bad request body: upstream = "
                                        f"{show_value(body['upstream'])}: expected a string")
                upstream = parse_address(body["upstream"], "upstream",
                                         allow_unix=route.cfg.protocol != UNDECODED)
        except ConfigError as exc:
            raise ApiError(400, str(exc)) from None
        enabled = body.get("enabled", self.app.route_enabled(route))
        if not isinstance(enabled, bool):
            raise ApiError(400, f"bad request body: enabled = {show_value(enabled)}: "
                                "expected true or false")
        current = self.app.disabled.get(name) or route.address
        differs = upstream != route.cfg.upstream or (
            "listen" in body and (isinstance(listen, UnixAddress) or listen[1] == 0
                                  or tuple(listen) != tuple(current)))
        if differs:
            await self.app.set_route_enabled(name, False)
            route.cfg.upstream = upstream
            if "listen" in body:
                self.app.disabled[name] = listen
        if enabled != self.app.route_enabled(route):
            try:
                await self.app.set_route_enabled(name, enabled)
            except OSError as exc:
                raise self._bind_error(exc, self.app.disabled.get(name, listen)) from None

    # -- Toxiproxy: proxies -----------------------------------------------------------

    async def proxy_index(self, request):
        return _json({r.cfg.name: self.proxy_json(r) for r in self.app.routes})

    async def proxy_create(self, request):
        body = await _body(request)
        async with self.lock:
            cfg = self.route_config(body)
            route = await self._create(cfg, body.get("enabled", True))
            return _json(self.proxy_json(route), 201)

    async def populate(self, request):
        """Toxiproxy's PopulateJson: every entry checked first; then each one created, or
        replaced when its listen or upstream differs from the existing proxy's."""
        body = await _body(request, expect=list)
        done = []
        async with self.lock:
            configs = []
            for i, item in enumerate(body):
                if not isinstance(item, dict):
                    raise ApiError(400, f"bad request body: proxy {i + 1} = "
                                        f"{show_value(item)}: expected a JSON object")
                configs.append((self.route_config(item, f"proxy {i + 1}: "),
                                item.get("enabled", True), item))
            try:
                for cfg, enabled, item in configs:
                    try:
                        existing = self.app.route_named(cfg.name)
                    except KeyError:
                        existing = None
                    if existing is not None:
                        if not self._differs(existing, cfg):
                            done.append(existing)
                            continue
                        await self.app.remove_route(cfg.name)
                    done.append(await self._create(cfg, enabled))
            except ApiError as exc:
                return _json({"error": exc.message, "status": exc.status,
                              "proxies": [self.proxy_json(r) for r in done]}, exc.status)
            return _json({"proxies": [self.proxy_json(r) for r in done]}, 201)

    async def proxy_show(self, request):
        return _json(self.proxy_json(self._route(request.match_info["proxy"])))

    async def proxy_update(self, request):
        route = self._route(request.match_info["proxy"])
        body = await _body(request)
        for key in body:
            if key not in PROXY_KEYS:
                raise ApiError(400, f"bad request body: unknown key {key!r} (expected one "
                                    f"of: {', '.join(PROXY_KEYS)})")
        if body.get("name", route.cfg.name) != route.cfg.name:
            raise ApiError(400, f"name = {show_value(body['name'])}: a proxy cannot be "
                                "renamed (delete it and create the new one)")
        if body.get("frametap_protocol", route.cfg.protocol) != route.cfg.protocol:
            raise ApiError(400, f"frametap_protocol = {show_value(body['frametap_protocol'])}"
                                ": a proxy's protocol cannot change (delete it and create "
                                "the new one)")
        async with self.lock:
            route = self._route(route.cfg.name)       # still there after the wait
            await self._update(route, body)
            return _json(self.proxy_json(route))

    async def proxy_delete(self, request):
        async with self.lock:
            route = self._route(request.match_info["proxy"])
            await self.app.remove_route(route.cfg.name)
        return web.Response(status=204)

    async def reset(self, request):
        async with self.lock:
            for route in list(self.app.routes):
                if not self.app.route_enabled(route):
                    try:
                        await self.app.set_route_enabled(route.cfg.name, True)
                    except OSError as exc:
                        raise self._bind_error(exc, self.app.disabled[route.cfg.name]) \
                            from None
                route.cfg.faults.reset(rules=False)
        return web.Response(status=204)

    async def version(self, request):
        return _json({"version": TOXIPROXY_VERSION, "frametap": _frametap_version()})

    # -- Toxiproxy: toxics ------------------------------------------------------------

    async def toxic_index(self, request):
        route = self._route(request.match_info["proxy"])
        return _json([t.to_json() for t in route.cfg.faults.toxics()])

    async def toxic_create(self, request):
        route = self._route(request.match_info["proxy"])
        body = await _body(request)
        return _json(route.cfg.faults.add_toxic(body).to_json())

    async def toxic_show(self, request):
        route = self._route(request.match_info["proxy"])
        return _json(route.cfg.faults.toxic(request.match_info["toxic"]).to_json())

    async def toxic_update(self, request):
        route = self._route(request.match_info["proxy"])
        faults = route.cfg.faults
        faults.toxic(request.match_info["toxic"])        # 404 before the body's 400
        body = await _body(request)
        return _json(faults.update_toxic(request.match_info["toxic"], body).to_json())

    async def toxic_delete(self, request):
        route = self._route(request.match_info["proxy"])
        route.cfg.faults.remove_toxic(request.match_info["toxic"])
        return web.Response(status=204)

    # -- frametap: routes and rules ---------------------------------------------------

    async def route_index(self, request):
        return _json([self.route_json(r) for r in self.app.routes])

    async def route_show(self, request):
        return _json(self.route_json(self._route(request.match_info["route"], "route")))

    async def fault_index(self, request):
        route = self._route(request.match_info["route"], "route")
        return _json([r.to_json() for r in route.cfg.faults.rules()])

    async def fault_create(self, request):
        route = self._route(request.match_info["route"], "route")
        body = await _body(request)
        return _json(route.cfg.faults.add_rule(body).to_json(), 201)

    async def fault_clear(self, request):
        route = self._route(request.match_info["route"], "route")
        route.cfg.faults.reset(toxics=False)
        return web.Response(status=204)

    async def fault_show(self, request):
        route = self._route(request.match_info["route"], "route")
        return _json(route.cfg.faults.rule(request.match_info["name"]).to_json())

    async def fault_update(self, request):
        route = self._route(request.match_info["route"], "route")
        faults = route.cfg.faults
        faults.rule(request.match_info["name"])          # 404 before the body's 400
        body = await _body(request)
        return _json(faults.update_rule(request.match_info["name"], body).to_json())

    async def fault_delete(self, request):
        route = self._route(request.match_info["route"], "route")
        route.cfg.faults.remove_rule(request.match_info["name"])
        return web.Response(status=204)
