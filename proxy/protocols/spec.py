"""``ProtocolSpec``: what the rest of frametap needs to know about one protocol.

Each protocol package declares one, ``PROTOCOL = ProtocolSpec(...)`` in its
``__init__.py``; ``proxy.protocols`` finds them (docs/design.md, "Layout": everything
about a protocol lives in its folder). The CLI, the config checker, the relay, the
locustfile, the demo, the parser benchmark and the build checks read these
descriptors and keep no protocol list of their own.

Only names are stored for the heavy parts (parser, codec, reference server, Locust
users, bench samples): importing a descriptor must not import Locust, gevent or
loadgen. ``load_parser()`` and friends import on first use.
"""

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: The modules every protocol folder has, under these names (docs/adding-a-protocol.md,
#: "Files"); a folder may add its own beside them (rocketmq's jsonscan.py, options.py).
KIT_MODULES = ("__init__.py", "_parser.pyx", "parser_py.py", "constants.py", "codec.py",
               "conformance.py", "samples.py", "faults.py")

@dataclass(frozen=True, eq=False)
class DemoRoute:
    """One proxy route of the demo, in front of one listener of the reference server.

    ``options`` becomes the route's ``[routes.options]`` table; string keys and values
    may name addresses as ``{server_<listener>}`` (the reference server's) or
    ``{proxy_<listener>}`` (the proxy route's in front of it).
    """

    listener: str = "listen"          # which of DemoSpec.listeners this route fronts
    suffix: str = ""                  # route name = protocol name + suffix
    options: Mapping = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class DemoSpec:
    """How ``frametap demo`` runs this protocol's reference server behind the proxy.

    The demo starts ``frametap serve <name> <server_args>`` with ``{server_<listener>}``
    replaced by ``127.0.0.1:0`` and ``{service_time}`` by ``--service-time``, and reads
    the ports it bound from its ``--ready-file`` (a listener of the same name as a server
    role, e.g. rocketmq's ``namesrv``, is that role's; otherwise listeners follow the bind
    order). Locust then connects to the proxy route in front of ``locust_listener``. ``needs`` lists ``(program, how to install it)``
    pairs the server or users must find on PATH; when one is missing the demo leaves the
    protocol out with one line saying so, instead of failing.
    """

    server_args: tuple = ("--listen", "{server_listen}")
    listeners: tuple = ("listen",)
    routes: tuple = (DemoRoute(),)
    locust_listener: str = "listen"
    needs: tuple = ()


@dataclass(frozen=True, eq=False)       # compared and hashed by identity: one per protocol
class ProtocolSpec:
    """Descriptor of one protocol package (``proxy/protocols/<pkg>/__init__.py``).

    Module paths are dotted strings, imported lazily by the ``load_*`` methods.
    """

    name: str                         # protocol name in configs, CLI and metrics ("rocketmq")
    package: str                      # "proxy.protocols.rocketmq"
    parser_class: str                 # class in <package>._parser and <package>.parser_py
    default_port: int                 # the real service's usual port
    max_frame_bytes: int              # default per-route frame limit (max_frame_bytes key)
    #: ``validate_options(options, where) -> dict`` for ``[routes.options]`` (ConfigError
    #: on a bad value); None: the protocol takes no route options.
    validate_options: Callable | None = None
    codec: str | None = None          # default "<package>.codec"
    samples: str | None = None        # default "<package>.samples" (bench frames)
    conformance: str | None = None    # default "<package>.conformance" (tests/test_conformance.py)
    server: str | None = None         # reference server module with main(argv), in loadgen/
    users: str | None = None          # module of the Locust users, in loadgen/
    user_classes: tuple = ()          # the concrete Locust users it offers
    demo: DemoSpec | None = None      # None: `frametap demo` leaves this protocol out
    #: True: the protocol rewrites addresses its servers advertise (proxy.protocols.advertise):
    #: the ``advertise`` route option, and parsers with ``local_address`` and
    #: ``upstream_address``, which the relay sets on every connection.
    advertise: bool = False

    def __post_init__(self):
        if self.codec is None:
            object.__setattr__(self, "codec", self.package + ".codec")
        if self.samples is None:
            object.__setattr__(self, "samples", self.package + ".samples")
        if self.conformance is None:
            object.__setattr__(self, "conformance", self.package + ".conformance")

    @property
    def extension(self):
        """Module path of the compiled parser (built from ``_parser.pyx``)."""
        return self.package + "._parser"

    @property
    def twin(self):
        """Module path of the pure-Python parser twin."""
        return self.package + ".parser_py"

    @property
    def constants(self):
        """Module path of the protocol's constants (wire numbers, names, MAX_FRAME_BYTES)."""
        return self.package + ".constants"

    def load_parser(self, pure_python=None):
        """The parser class: compiled, or the twin when ``pure_python`` (default:
        ``FRAMETAP_NO_EXTENSIONS``, as ``proxy.framing`` reads it)."""
        if pure_python is None:
            from proxy.framing import NO_EXTENSIONS
            pure_python = NO_EXTENSIONS
        module = importlib.import_module(self.twin if pure_python else self.extension)
        return getattr(module, self.parser_class)

    def load_codec(self):
        return importlib.import_module(self.codec)

    def load_samples(self):
        return importlib.import_module(self.samples)

    def load_conformance(self):
        """Golden conversations, garbage and frame strategies (tests only: hypothesis)."""
        return importlib.import_module(self.conformance)

    def load_server(self):
        """The reference server module (``main(argv)``); None when there is none."""
        return importlib.import_module(self.server) if self.server else None

    def load_users(self):
        """{class name: Locust user class}; imports Locust (which gevent-patches)."""
        if not self.users:
            return {}
        module = importlib.import_module(self.users)
        return {cls: getattr(module, cls) for cls in self.user_classes}

    def module_getattr(self):
        """A module ``__getattr__`` (PEP 562) resolving ``Parser`` and the parser class
        name lazily, so ``from proxy.protocols.flymq import FlyMQParser`` keeps working
        without the package importing its parser up front."""
        def __getattr__(attr):
            if attr in ("Parser", self.parser_class):
                return self.load_parser()
            raise AttributeError(f"module {self.package!r} has no attribute {attr!r}")
        return __getattr__
