"""Protocol registry: one sub-package per protocol (docs/design.md, "Layout").

A sub-package counts as a protocol when its ``__init__.py`` defines ``PROTOCOL``, a
``ProtocolSpec`` (see ``proxy.protocols.spec``). Nothing here lists them: adding a
protocol is adding a folder. ``KNOWN`` is the product's list (docs/design.md, "Command
line"), used only to tell "not implemented in this build" from "no such protocol".

``python -m proxy.protocols --check-build`` imports every compiled extension (the
Makefile's install check).
"""

import functools
import importlib
import pkgutil

from proxy.protocols.spec import DemoRoute, DemoSpec, ProtocolSpec  # noqa: F401

#: Every protocol name of the product (docs/design.md, "Command line").
KNOWN = ("rocketmq", "fleximq", "flymq", "rabbitmq-stream", "ttheader")


@functools.cache
def _registry():
    found = {}
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        if not info.ispkg:
            continue
        spec = getattr(importlib.import_module(info.name), "PROTOCOL", None)
        if not isinstance(spec, ProtocolSpec):
            continue
        if spec.name in found:
            raise ImportError(f"protocol {spec.name!r} is declared by both "
                              f"{found[spec.name].package} and {spec.package}")
        found[spec.name] = spec
    return dict(sorted(found.items()))


def specs():
    """Every protocol of this build, ordered by name."""
    return list(_registry().values())


def names():
    """Names of the protocols this build implements, sorted."""
    return list(_registry())


def load(name):
    """The ``ProtocolSpec`` of ``name``; KeyError when this build does not have it."""
    return _registry()[name]


def accepted():
    """Names a config may use: the product's list plus any protocol found here."""
    return list(KNOWN) + [n for n in names() if n not in KNOWN]


def unavailable_message(name):
    """Why ``name`` cannot be used, in the words of a config/CLI error (no prefix)."""
    if name in KNOWN:
        return f"{name!r} is not implemented in this build (available: {', '.join(names())})"
    return f"{name!r} is not a protocol (expected one of: {', '.join(accepted())})"


def forget():
    """Drop the discovery cache (tests that add a protocol package on the fly)."""
    _registry.cache_clear()


def extension_modules():
    """Dotted names of the compiled modules a build must contain: every ``.pyx`` under
    ``proxy/``, and every ``*_c.py`` with a ``.pxd`` beside it (the rules setup.py builds
    by)."""
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent      # proxy/
    sources = list(root.rglob("*.pyx"))
    sources += [p for p in root.rglob("*_c.py") if p.with_suffix(".pxd").exists()]
    return sorted(".".join(("proxy",) + p.relative_to(root).with_suffix("").parts)
                  for p in sources)


def check_build():
    """Import every compiled module and every protocol's compiled parser class; returns
    what was checked, raises ImportError naming the first missing one."""
    checked = []
    for module in extension_modules():
        mod = importlib.import_module(module)
        if mod.__file__.endswith((".py", ".pyc", ".pyx")):
            raise ImportError(f"{module} is not compiled ({mod.__file__})")
        checked.append(module)
    for spec in specs():
        spec.load_parser(pure_python=False)
        if spec.extension not in checked:
            checked.append(spec.extension)
    return checked
