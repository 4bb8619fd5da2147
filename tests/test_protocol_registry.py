"""Protocols are discovered from their folders: a new proxy/protocols/<pkg>/ (plus its
loadgen side) reaches the config, the CLI, the relay, the locustfile, the demo and the
parser bench without touching a shared file.

The proof is a throw-away protocol, "toy", written to a temporary directory that is added
to ``proxy.protocols.__path__`` (in this process, or in a subprocess for Locust and the
bench). Its parsers and samples borrow FlyMQ's; only the folder is new.
"""

import ast
import importlib
import json
import re
import subprocess
import sys
import textwrap
import tokenize
import tomllib

import pytest

from proxy import protocols
from proxy.config import config_from_dict
from proxy.errors import ConfigError
from tests._support.processes import ROOT


TOY_FILES = {
    "toy/__init__.py": '''
        """A throw-away protocol for tests/test_protocol_registry.py."""
        from proxy.errors import ConfigError
        from proxy.protocols.spec import DemoRoute, DemoSpec, ProtocolSpec


        def validate_options(options, where):
            for key in options:
                if key != "colour":
                    raise ConfigError(f"{where}.options: unknown key {key!r}")
            return dict(options)


        PROTOCOL = ProtocolSpec(
            name="toy", package=__name__, parser_class="ToyParser", default_port=7777,
            max_frame_bytes=4096, validate_options=validate_options,
            server="toyload.server", users="toyload.users", user_classes=("ToyUser",),
            demo=DemoSpec(server_args=("--listen", "{server_listen}", "--service-time",
                                       "{service_time}"),
                          routes=(DemoRoute(options={"colour": "{proxy_listen}"}),)))
        ''',
    "toy/_parser.py": '''
        from proxy.protocols.flymq._parser import FlyMQParser as ToyParser  # noqa: F401
        ''',
    "toy/parser_py.py": '''
        from proxy.protocols.flymq.parser_py import FlyMQParser as ToyParser  # noqa: F401
        ''',
    "toy/codec.py": '''
        from proxy.protocols.flymq.codec import *  # noqa: F401,F403
        ''',
    "toy/samples.py": '''
        from proxy.protocols.flymq.samples import bench_frames  # noqa: F401
        TARGET_FPS = 1
        TARGET_RATIO = 1.0
        ''',
    "not_a_protocol/__init__.py": '''
        """A sub-package without PROTOCOL is not a protocol."""
        ''',
}
LOADGEN_FILES = {
    "toyload/__init__.py": "",
    "toyload/server.py": '''
        def main(argv):
            print("toy server", argv)
            return 0
        ''',
    "toyload/users.py": '''
        from locust import User, task


        class ToyUser(User):
            @task
            def nothing(self):
                pass
        ''',
}


def write_tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy protocol, discoverable in this process; returns the two directories."""
    pkgroot, loadroot = tmp_path / "protocols", tmp_path / "loadgen"
    write_tree(pkgroot, TOY_FILES)
    write_tree(loadroot, LOADGEN_FILES)
    monkeypatch.setattr(protocols, "__path__", list(protocols.__path__) + [str(pkgroot)])
    monkeypatch.syspath_prepend(str(loadroot))
    protocols.forget()
    yield pkgroot, loadroot
    protocols.forget()
    for name in list(sys.modules):
        if name.startswith(("proxy.protocols.toy", "proxy.protocols.not_a_protocol", "toyload")):
            del sys.modules[name]


def run_with_toy(toy, code, **kw):
    """Run ``code`` in a fresh interpreter that discovers the toy protocol."""
    pkgroot, loadroot = toy
    boot = (f"import sys, proxy.protocols as p; p.__path__.append({str(pkgroot)!r}); "
            f"sys.path.insert(0, {str(loadroot)!r}); sys.path.insert(0, {str(ROOT)!r})\n")
    return subprocess.run([sys.executable, "-c", boot + code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, **kw)


def test_registry_finds_the_shipped_packages():
    folders = {p.parent.name for p in (ROOT / "proxy" / "protocols").glob("*/__init__.py")}
    packages = {spec.package.rpartition(".")[2] for spec in protocols.specs()}
    assert packages == folders
    assert protocols.names() == sorted(protocols.names())
    for spec in protocols.specs():
        assert protocols.load(spec.name) is spec
        assert spec.name in protocols.KNOWN        # the shipped ones are product protocols


def test_descriptors_stay_cheap_to_import():
    code = ("import sys, proxy.protocols as p; p.specs(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'locust', 'gevent', 'loadgen', 'uvloop'}), "
            "sorted(m for m in sys.modules if m.startswith('proxy') and m.endswith("
            "('._parser', '.parser_py', 'framing'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.split() == ["[]", "[]"]


def test_toy_is_discovered(toy):
    assert "toy" in protocols.names() and "not_a_protocol" not in protocols.names()
    spec = protocols.load("toy")
    assert spec.load_parser(pure_python=True).__module__ == "proxy.protocols.flymq.parser_py"
    assert spec.codec == "proxy.protocols.toy.codec" and spec.load_codec()
    assert spec.load_samples().TARGET_FPS == 1
    assert "toy" in protocols.accepted()                # not in KNOWN, still accepted


def test_toy_in_config_and_relay(toy):
    cfg = config_from_dict({"routes": [{"protocol": "toy", "listen": "127.0.0.1:0",
                                        "upstream": "127.0.0.1:7777",
                                        "options": {"colour": "red"}}]})
    assert cfg.routes[0].protocol == "toy" and cfg.routes[0].options == {"colour": "red"}
    with pytest.raises(ConfigError, match=r"routes\[0\].options: unknown key 'size'"):
        config_from_dict({"routes": [{"protocol": "toy", "listen": "a:1", "upstream": "b:2",
                                      "options": {"size": 1}}]})
    import asyncio

    from proxy.relay import Route
    loop = asyncio.new_event_loop()
    try:
        route = Route(cfg.routes[0], loop=loop)
    finally:
        loop.close()
    assert route.max_frame_bytes == 4096
    assert route.parser_class is protocols.load("toy").load_parser()


def test_toy_in_cli(toy, capsys, monkeypatch):
    from proxy import cli
    assert cli.main(["serve", "toy", "--flag"]) == 0
    assert "toy server ['--flag']" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "toy" in capsys.readouterr().out
    # every name of the product's list is built now: a listed name this build lacks
    monkeypatch.setattr(protocols, "KNOWN", protocols.KNOWN + ("mqtt5",))
    assert cli.main(["serve", "mqtt5"]) == 2
    assert "'mqtt5' is not implemented in this build" in capsys.readouterr().err
    assert cli.main(["proxy", "--protocol", "mqtt5", "--listen", "127.0.0.1:0",
                     "--upstream", "127.0.0.1:1"]) == 2
    assert "not implemented in this build" in capsys.readouterr().err


def test_toy_in_demo(toy):
    from loadgen import demo
    assert "toy" in demo.demo_protocols()
    assert "toy" in demo.build_parser().parse_args([]).protocols.split(",")
    spec = demo.demo_protocols()["toy"]
    argv = demo.server_plan(spec, "1ms")
    assert argv[:3] == ["serve", "toy", "--listen"] and argv[-2:] == ["--service-time", "1ms"]
    assert argv[3] == "127.0.0.1:0"                       # its ready file names the port
    servers = demo.server_addresses(spec, {"listen": ["127.0.0.1:4321"], "roles": {}})
    assert servers == {"listen": "127.0.0.1:4321"}
    # the route's own address is in its options: that port is picked before the proxy runs
    assert demo.pinned_listeners(spec) == ["listen"]
    tables, by_listener, names = demo.route_plan(spec, servers, pick_port=lambda: 5555)
    assert names == ["toy"] and by_listener == {"listen": "toy"}
    cfg = config_from_dict(tomllib.loads("\n".join(tables)))
    route = cfg.routes[0]
    assert (route.name, route.protocol, route.upstream) == ("toy", "toy", ("127.0.0.1", 4321))
    assert route.listen == ("127.0.0.1", 5555) and route.options == {"colour": "127.0.0.1:5555"}


@pytest.mark.slow
def test_toy_in_locustfile(toy):
    code = ("sys.argv = ['locust', '-f', 'loadgen/locustfile.py', '--list']\n"
            "from locust.main import main\nmain()\n")
    r = run_with_toy(toy, code)
    assert r.returncode == 0, r.stderr
    assert "ToyUser" in r.stdout and "FlyMQProducer" in r.stdout


@pytest.mark.slow
def test_toy_in_parser_bench(toy, tmp_path):
    out = tmp_path / "bench.json"
    code = ("import runpy\nsys.argv = ['parser_bench.py', '--protocol', 'toy', '--trials', '1', "
            f"'--min-time', '0.001', '--json-out', {str(out)!r}]\n"
            "runpy.run_path('bench/parser_bench.py', run_name='__main__')\n")
    r = run_with_toy(toy, code)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert result["protocols"]["toy"]["frames_per_pass"] == 2 * 4096


def test_every_sample_feeds_both_parsers_cleanly():
    """Each protocol's bench samples are valid traffic for its own parsers."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import parser_bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from proxy.framing import RouteStats
    for spec in protocols.specs():
        _, reqs, resps = spec.load_samples().bench_frames(64, 64)
        schedule, frames = parser_bench.build_schedule(reqs, resps)
        parser_bench.verify(spec.load_parser(), RouteStats, schedule, frames, spec.name)


# --- no protocol list in shared code -------------------------------------------------

SHARED = ["proxy/cli.py", "proxy/config.py", "proxy/relay.py", "proxy/app.py",
          "proxy/protocols/__init__.py", "proxy/protocols/__main__.py",
          "proxy/protocols/spec.py", "setup.py", "loadgen/locustfile.py", "loadgen/demo.py",
          "bench/parser_bench.py"]


def protocol_literals(path, shipped):
    """(line, literal) for every string literal in ``path`` that is a protocol name or a
    module path of a protocol package (comments and prose are not counted)."""
    module_path = re.compile(r"(proxy\.protocols|loadgen)\.(%s)(\..*)?" % "|".join(
        re.escape(s.package.rpartition(".")[2]) for s in shipped))
    names = {s.name for s in shipped}
    hits = []
    with open(path, "rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type != tokenize.STRING:
                continue
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, bytes):
                continue
            if value in names or module_path.fullmatch(value):
                hits.append((tok.start[0], value))
    return hits


def test_shared_code_names_no_protocol():
    shipped = protocols.specs()
    for rel in SHARED:
        path = ROOT / rel
        lines = path.read_text().splitlines()
        hits = [(n, v) for n, v in protocol_literals(path, shipped)
                if not lines[n - 1].startswith("KNOWN = ")]      # the product's list
        assert not hits, f"{rel} names protocols: {hits}"
    makefile = (ROOT / "Makefile").read_text()
    for spec in shipped:
        assert spec.package.rpartition(".")[2] not in makefile


def test_literal_scan_would_catch_a_list(tmp_path):
    path = tmp_path / "shared.py"
    path.write_text('"""Serves flymq."""\n'
                    'SERVERS = {"flymq": "loadgen.flymq.server"}  # "rocketmq" in a comment\n'
                    'HELP = "e.g. frametap serve rocketmq"\n')
    assert protocol_literals(path, protocols.specs()) == [(2, "flymq"),
                                                          (2, "loadgen.flymq.server")]


@pytest.mark.parametrize("module, must_not_import", [
    # option validators used proxy.config.parse_address; proxy.config imports the registry
    ("proxy.protocols.rocketmq.options", "proxy.config"),
    ("proxy.protocols.rabbitmq_stream.rewrite", "proxy.config"),
    # the demo took locustfile_path from proxy.cli, which imports the demo
    ("loadgen.demo", "proxy.cli"),
])
def test_no_import_cycle(module, must_not_import):
    code = f"import sys, {module}; print({must_not_import!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


# --- the kit: the same module names, one frame limit, one advertise hook ------------

def _folder(spec):
    return ROOT.joinpath(*spec.package.split("."))


def test_every_protocol_folder_has_the_kit_modules():
    from proxy.protocols.spec import KIT_MODULES
    for spec in protocols.specs():
        files = {p.name for p in _folder(spec).iterdir()}
        assert set(KIT_MODULES) <= files, (spec.name, sorted(set(KIT_MODULES) - files))
        # the constants module has one name: no folder keeps one of the old names
        assert not files & {"names.py", "codes.py", "opcodes.py", "status.py"}, spec.name
        assert importlib.import_module(spec.constants).__file__.endswith("constants.py")


_LIMIT_DEF = re.compile(r"^\s*(cdef\s+[\w ]+\s+)?MAX_FRAME_BYTES\s*[:=]", re.M)
_LIMIT_LITERAL = re.compile(r"max_frame_bytes\s*=\s*[\d(]")


def test_one_frame_limit_per_protocol():
    """MAX_FRAME_BYTES is defined once, in constants.py, and the descriptor, both parser
    twins, the codec's defaults and the loadgen side all use that one."""
    from tests.parsers import make, parser_impls
    for spec in protocols.specs():
        limit = importlib.import_module(spec.constants).MAX_FRAME_BYTES
        assert spec.max_frame_bytes == limit, spec.name
        for label, impl in parser_impls(spec.name).items():
            _, parser = make(impl, spec.name)
            assert parser.max_frame_bytes == limit, (spec.name, label)
        pkg = spec.package.rpartition(".")[2]
        defs, literals = [], []
        for folder in (_folder(spec), ROOT / "loadgen" / pkg):
            for path in sorted(folder.glob("*.py*")):
                if path.suffix not in (".py", ".pyx", ".pxd"):
                    continue
                text = path.read_text()
                rel = str(path.relative_to(ROOT))
                defs += [rel] * len(_LIMIT_DEF.findall(text))
                literals += [rel] * len(_LIMIT_LITERAL.findall(text))
        assert defs == [f"proxy/protocols/{pkg}/constants.py"], (spec.name, defs)
        assert not literals, (spec.name, literals)
    from proxy.protocols.rocketmq import codec, constants
    import inspect
    assert inspect.signature(codec.decode).parameters["max_frame_bytes"].default == \
        constants.MAX_FRAME_BYTES


def test_advertise_hook_one_shape():
    """Protocols that rewrite advertised addresses say so in the descriptor; their
    parsers (both twins) have the two addresses the relay sets, the others do not; the
    advertise option has one shape for all of them."""
    from tests.parsers import make, parser_impls
    rewriting = [s for s in protocols.specs() if s.advertise]
    assert sorted(s.name for s in rewriting) == ["rabbitmq-stream", "rocketmq"]
    for spec in protocols.specs():
        for label, impl in parser_impls(spec.name).items():
            _, parser = make(impl, spec.name)
            assert hasattr(parser, "local_address") == spec.advertise, (spec.name, label)
            assert hasattr(parser, "upstream_address") == spec.advertise, (spec.name, label)
    for spec in rewriting:
        opts = spec.validate_options({"advertise": {"10.0.0.7:10911": "[::1]:20911"}}, "r")
        assert opts["advertise"] == {("10.0.0.7", 10911): ("::1", 20911)}, spec.name
        with pytest.raises(ConfigError, match=r"^r\.options\.advertise\['a:1'\] = 'b': "):
            spec.validate_options({"advertise": {"a:1": "b"}}, "r")
        with pytest.raises(ConfigError, match=r"^r\.options\.advertise = 3: expected a table"):
            spec.validate_options({"advertise": 3}, "r")


def test_relay_sets_the_advertise_addresses():
    import asyncio

    from proxy.relay import Route
    for protocol, options in (("rocketmq", {"advertise": {"10.0.0.7:10911": "127.0.0.1:1"}}),
                              ("rabbitmq-stream", {}), ("flymq", {})):
        cfg = config_from_dict({"routes": [{"protocol": protocol, "listen": "127.0.0.1:0",
                                            "upstream": "127.0.0.1:7777",
                                            "options": options}]})
        loop = asyncio.new_event_loop()
        try:
            route = Route(cfg.routes[0], loop=loop)
            parser = route.new_parser(("127.0.0.1", 5555))
            unix = route.new_parser("/tmp/x.sock")
        finally:
            loop.close()
        if protocols.load(protocol).advertise:
            assert parser.local_address == ("127.0.0.1", 5555), protocol
            assert parser.upstream_address == ("127.0.0.1", 7777), protocol
            assert unix.local_address is None, protocol
        else:
            assert not hasattr(parser, "local_address"), protocol


def test_rocketmq_rewrites_with_the_validated_option():
    """The option as the config checker returns it ((host, port) pairs) rewrites route
    data as the raw text form did."""
    from proxy.protocols import advertise
    from proxy.protocols.rocketmq.options import RouteRewriter
    raw = {"10.0.0.7:10911": "proxyhost:20911", "[fe80::1]:10911": "[::1]:20911"}
    checked = advertise.validate({"advertise": raw}, "r")
    assert advertise.as_text(checked) == raw
    assert RouteRewriter(checked).replacements == RouteRewriter(raw).replacements


def test_skip_some():
    from proxy.framing_common import skip_some
    assert skip_some(10, 4) == (4, 6)
    assert skip_some(3, 8) == (3, 0)
    assert skip_some(0, 8) == (0, 0)
    assert skip_some(5, 0) == (0, 5)


# --- the shared files a new protocol still edits (docs/adding-a-protocol.md) -----------

#: The guide's table, in its order: per-protocol lists and text kept on purpose, then the
#: two files a protocol touches only for a new dependency.
NEW_PROTOCOL_EDITS = ["proxy/protocols/__init__.py", "README.md", "bench/fuzz_twins.py",
                      "tests/test_fault_replies.py", "tests/test_fault_config.py",
                      "docs/design.md", "docs/adding-a-protocol.md",
                      "tests/test_fault_replies_real.py", "pyproject.toml", ".ci/run"]


def _guide_edits():
    text = (ROOT / "docs" / "adding-a-protocol.md").read_text()
    start = text.index("## Shared files a new protocol touches")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else len(text)]
    return [f for cell in re.findall(r"^\| (.+?) \|", section, re.M)
            for f in re.findall(r"`([^`]+)`", cell)]


def test_the_guide_lists_the_shared_files_a_new_protocol_edits():
    assert _guide_edits() == NEW_PROTOCOL_EDITS
    # the files that find a protocol by themselves, but for the product's list (KNOWN)
    assert set(NEW_PROTOCOL_EDITS) & set(SHARED) == {"proxy/protocols/__init__.py"}
    for rel in NEW_PROTOCOL_EDITS[:-2]:                   # each keeps a per-protocol list
        text = (ROOT / rel).read_text().lower()
        for spec in protocols.specs():
            pkg = spec.package.rpartition(".")[2]
            assert spec.name in text or pkg in text, (rel, spec.name)
