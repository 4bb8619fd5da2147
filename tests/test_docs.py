"""The README and the design document stay true to the tree (issue 24, "the README"):
every ``frametap`` command and ``make`` target the README shows exists with the options it
uses, every repository path and link it names exists, the benchmark part is one table of
headline figures (with the day and commit each was recorded at) and points to
docs/benchmarks.md, and docs/design.md's layout names every module that exists."""

import functools
import os
import re
import subprocess
import sys

import pytest
from tests._support.processes import ROOT

README = (ROOT / "README.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def _section(text, heading):
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _shell_commands(text):
    """Every command of the ```sh blocks (continuation lines joined, comments cut) and
    every inline `frametap ...` / `make ...` span."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    commands += re.findall(r"`((?:frametap|make) [^`]+)`", text)
    return commands


def _words(command):
    """The command's words after any VAR=value prefixes."""
    words = command.split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words.pop(0)
    return words


def test_the_two_commands_come_first():
    first = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first and README.index(first.group(0)) < README.index("\n## "), \
        "the README must open with its commands"
    lines = [ln.split()[:2] for ln in first.group(1).splitlines() if ln.strip()]
    assert lines[:2] == [["make", "demo"], ["make", "test"]], lines
    intro = README[:README.index("\n## ")]
    for needed in (".venv", "Java 17", "pip install -e", "openssl"):
        assert needed in intro, f"the intro no longer says what the commands need: {needed}"


def test_every_make_target_shown_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.M))
    shown = {words[1] for text in (README, BENCHMARKS.read_text())
             for words in map(_words, _shell_commands(text))
             if words[:1] == ["make"] and len(words) > 1}
    assert {"demo", "test", "test-fast", "bench", "guard", "soak"} <= shown, shown
    assert not shown - targets, f"make targets the docs show that the Makefile lacks: {shown - targets}"


@functools.lru_cache(maxsize=None)
def _help(words):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "proxy", *words, "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"frametap {' '.join(words)} --help: {r.stderr[-500:]}"
    return r.stdout


def _frametap_commands():
    """(subcommand words, command) for every frametap command the README shows; a
    placeholder (`serve P`) or an alternation (`faults list|add|remove`) stands for each."""
    from proxy import protocols
    out = []
    for command in _shell_commands(README):
        words = _words(command)
        if words[:1] != ["frametap"] or len(words) < 2 or words[1].startswith("-"):
            continue
        if words[1] in ("serve", "faults") and len(words) > 2 and not words[2].startswith("-"):
            if words[2] == "P":
                choices = protocols.names()
            else:
                choices = words[2].split("|")
            out += [((words[1], c), command) for c in choices]
        else:
            out.append(((words[1],), command))
    return out


@pytest.mark.slow
def test_every_frametap_option_shown_exists():
    commands = _frametap_commands()
    seen = {sub[0] for sub, _ in commands}
    assert {"proxy", "serve", "load", "analyze", "faults", "demo"} <= seen, seen
    wrong = []
    for sub, command in commands:
        text = _help(sub)
        for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command))):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                wrong.append(f"frametap {' '.join(sub)} has no {flag} (README: {command[:80]})")
    assert not wrong, "\n".join(wrong)


def _repo_paths(text):
    """Repository paths in backticks or links: proxy/..., loadgen/..., bench/... ."""
    found = set(re.findall(r"\]\(((?!https?:|#)[^)#\s]+)", text))
    for span in re.findall(r"`([^`\n]+)`", text):
        for token in span.split():
            if re.match(r"(proxy|loadgen|bench|grafana|docs|tests|\.ci)/", token):
                found.add(token.rstrip(".,;:)"))
    return {p for p in found if not re.search(r"[<>*|{}]|\.\.\.|…", p)}


def test_every_path_the_readme_names_exists():
    missing = sorted(p for p in _repo_paths(README) if not (ROOT / p).exists())
    assert not missing, f"README names paths that do not exist: {missing}"


def test_benchmarks_are_one_headline_table():
    section = _section(README, "## Benchmarks")
    tables = re.findall(r"(?:^\|.*\|\n)+", section, re.M)
    assert len(tables) == 1, f"the README's benchmark part has {len(tables)} tables, not one"
    rows = tables[0].splitlines()[2:]
    for needed in ("64 B", "1 KiB", "16 KiB", "1 MiB", "p50", "frame log", "one core",
                   "second core", "TLS", "WebSocket"):
        assert any(needed in row for row in rows), f"no headline row for {needed}"
    for row in rows:
        assert re.search(r"\b20\d\d-\d\d-\d\d, [0-9a-f]{7,40}\b", row), \
            f"a headline figure without the day and commit it was recorded at: {row}"
    assert "docs/benchmarks.md" in section
    assert BENCHMARKS.exists()
    assert "benchmarks-loadgen.md" in BENCHMARKS.read_text()


def test_design_layout_names_every_module():
    layout = _section(DESIGN, "## Layout")
    modules = []
    for folder in ("proxy", "proxy/protocols", "loadgen", "loadgen/analysis"):
        for path in sorted((ROOT / folder).iterdir()):
            if path.suffix in (".py", ".pyx", ".pxd") and path.stem != "__init__":
                modules.append(path)
    missing = [str(p.relative_to(ROOT)) for p in modules
               if not re.search(rf"(?<![\w.]){re.escape(p.name)}(?![\w])", layout)]
    assert not missing, ("docs/design.md's layout does not name these modules: "
                         f"{missing}")
    for needed in ("framelog", "loadgen/analysis/"):
        assert needed in layout, needed
    stale = sorted(p for p in _repo_paths(layout) if not (ROOT / "docs" / p).exists()
                   and not (ROOT / p).exists() and "benchmarks-loadgen" not in p)
    assert not stale, f"docs/design.md's layout names paths that do not exist: {stale}"


def _bench_commands():
    """(script, subcommand or None, flags) for every benchmark command the docs show:
    `bench/x.py ...`, `x.py ...` naming a script in bench/, and make's BENCH_ARGS /
    GUARD_ARGS (run_bench.py, guard.py)."""
    out = []
    for text in (README, BENCHMARKS.read_text()):
        spans = re.findall(r"`([^`]+)`", text) + _shell_commands(text)
        for span in spans:
            span = " ".join(span.split())
            for var, script in (("BENCH_ARGS", "run_bench"), ("GUARD_ARGS", "guard")):
                for args in re.findall(rf'{var}="([^"]*)"', span):
                    out.append((script, None, args))
            m = re.match(r"(?:python )?(?:bench/)?(\w+)\.py(?: (flood|blackhole|proxyfuzz)\b)?(.*)",
                         span)
            if m and (ROOT / "bench" / f"{m.group(1)}.py").exists():
                out.append((m.group(1), m.group(2), m.group(3)))
    return out


def test_every_benchmark_option_shown_exists():
    commands = _bench_commands()
    assert {"run_bench", "guard", "soak", "ws_bench"} <= {c[0] for c in commands}, commands
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    helps, wrong = {}, []
    for script, sub, args in commands:
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", args)) - {"--help"}
        if not flags:
            continue
        key = (script, sub)
        if key not in helps:
            r = subprocess.run([sys.executable, f"bench/{script}.py", *([sub] if sub else []),
                                "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, f"bench/{script}.py --help: {r.stderr[-500:]}"
            helps[key] = r.stdout
        for flag in sorted(flags):
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[key]):
                wrong.append(f"bench/{script}.py {sub or ''} has no {flag}")
    assert not wrong, "\n".join(wrong)
