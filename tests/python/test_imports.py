"""The package imports cleanly: its import graph has no cycle, and every torchspeed module imports in
a fresh interpreter whichever module comes first (each module alone, then all of them in sorted and
in reverse order), so no module depends on another having been imported before it."""

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchspeed

# The package the other tests import (the installed one: in CI a clean clone's python/torchspeed has
# no native part, so its source folder is not importable on its own).
PACKAGE = Path(torchspeed.__file__).resolve().parent

# Cycles that other work of issue 24 removes (profile: hooks <-> step; quant: the package and its
# observer; prune: the package and its schedule). The test fails on any cycle not listed here;
# delete an entry once its cycle is gone.
KNOWN_CYCLES: list = []


def _modules() -> dict:
    """Module name -> source file, for every .py file of the package (packages by their
    __init__.py), plus the native module torchspeed._C (no source)."""
    mods = {"torchspeed._C": None}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _import_graph(mods: dict) -> dict:
    """Module -> the package modules it imports, at module level or inside a function (a
    function-local import still forms a cycle when its function runs)."""
    graph = {}
    for name, path in mods.items():
        if path is None:
            continue
        is_package = path.name == "__init__.py"
        here = name.split(".") if is_package else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""])
                else:
                    base = node.module or ""
                base = base.rstrip(".")
                for alias in node.names:  # `from pkg import module` imports pkg.module
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in mods else base)
        graph[name] = {t for t in targets if t in mods and t != name}
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reader_finds_a_cycle():
    # The checker itself: a two-module cycle and a three-module one are found, a chain is not.
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_relative_imports_resolve_to_package_modules():
    graph = _import_graph(_modules())
    assert "torchspeed._native" in graph["torchspeed"]
    assert "torchspeed.data.sources" in graph["torchspeed.data.loader"]
    assert "torchspeed._C" in graph["torchspeed._native"]


def test_no_import_cycle_in_the_package():
    cycles = _cycles(_import_graph(_modules()))
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"


def _importable() -> list:
    # __main__ modules run a command when imported; torchspeed._C is loaded by the package.
    return [m for m in _modules() if not m.endswith("__main__") and m != "torchspeed._C"]


# Imports torch once, then forks one child per order; each child is a fresh torchspeed import.
# An order is the modules to import, separated by commas.
_IMPORT_IN_CHILDREN = textwrap.dedent(
    """
    import importlib, os, sys, traceback
    import torch  # noqa: F401  (shared by the children: only torchspeed's import is measured)
    failed = []
    for order in sys.argv[1:]:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            for name in order.split(","):
                try:
                    importlib.import_module(name)
                except BaseException as e:
                    # An optional third-party package that is not installed (lightning, PIL)
                    # is not an import-order problem: the module says what to install.
                    chain = [e]
                    while chain[-1].__cause__ or chain[-1].__context__:
                        chain.append(chain[-1].__cause__ or chain[-1].__context__)
                    if any(
                        isinstance(x, ModuleNotFoundError)
                        and x.name
                        and not x.name.startswith("torchspeed")
                        for x in chain
                    ):
                        continue
                    os.write(w, f"{name}: {traceback.format_exc()}".encode())
                    code = 1
                    break
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            err = f.read().decode()
        _, status = os.waitpid(pid, 0)
        if status != 0:
            failed.append(f"order {order[:80]}...: {err or status}")
    print("\\n".join(failed))
    sys.exit(1 if failed else 0)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_every_module_imports_in_a_fresh_interpreter_in_any_order():
    names = sorted(_importable())
    orders = [
        *names,  # each module first, alone
        ",".join(names),  # all, sorted
        ",".join(reversed(names)),  # all, in reverse
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), *sys.path])
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_IN_CHILDREN, *orders],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
