"""Check patch targets against an SGLang release's *source* (a wheel), without importing it.

Used by the tests to keep the 0.5.15 and 0.5.23 targets honest while only 0.5.17 is
installed: each dotted target is located in the wheel's module files with ``ast`` and
its parameter names are compared with the patch's ``params``.
"""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .registry import Patch


class WheelSource:
    def __init__(self, wheel: str | Path):
        self.wheel = Path(wheel)
        self.zip = zipfile.ZipFile(self.wheel)
        self.names = set(self.zip.namelist())
        self._trees: Dict[str, ast.Module] = {}

    def module_file(self, dotted: str) -> Optional[str]:
        base = dotted.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.names:
                return cand
        return None

    def tree(self, fname: str) -> ast.Module:
        if fname not in self._trees:
            self._trees[fname] = ast.parse(self.zip.read(fname).decode("utf-8"), filename=fname)
        return self._trees[fname]


def _find_in_body(body, name):
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


def _params(fn: ast.FunctionDef) -> Tuple[str, ...]:
    a = fn.args
    return tuple(x.arg for x in a.posonlyargs + a.args) + tuple(x.arg for x in a.kwonlyargs)


def _imported_from(src: WheelSource, fname: str, name: str) -> Optional[str]:
    """Dotted origin ``pkg.mod.orig`` of a module-level ``from pkg.mod import orig [as name]``."""
    package = fname[: -len("/__init__.py")] if fname.endswith("/__init__.py") else fname.rsplit("/", 1)[0]
    for node in src.tree(fname).body:
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            if (alias.asname or alias.name) != name:
                continue
            if node.level:
                base = package.split("/")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            return f"{mod}.{alias.name}"
    return None


def locate(src: WheelSource, target: str, _depth: int = 0) -> Tuple[Optional[Tuple[str, ...]], str]:
    """(parameter names or None, where/why) of ``target`` in the wheel.

    A module attribute bound by ``from X import f`` (a module global that a patch
    replaces in the importing module) is followed to ``X.f``.
    """
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        fname = src.module_file(".".join(parts[:i]))
        if fname is None:
            continue
        body = src.tree(fname).body
        node = None
        for j, p in enumerate(parts[i:]):
            node = _find_in_body(body, p)
            if node is None:
                # a method may be inherited from a base class defined in the same module
                if j > 0 and isinstance(prev, ast.ClassDef):
                    for b in prev.bases:
                        if isinstance(b, ast.Name):
                            base = _find_in_body(src.tree(fname).body, b.id)
                            if base is not None:
                                node = _find_in_body(base.body, p)
                                if node is not None:
                                    break
                if node is None and j == 0 and _depth < 8:
                    origin = _imported_from(src, fname, p)
                    if origin is not None:
                        params, where = locate(src, ".".join([origin] + parts[i + 1:]), _depth + 1)
                        return params, f"{where} (imported into {fname})"
                if node is None:
                    return None, f"{p!r} not found in {fname}"
            prev = node
            body = getattr(node, "body", [])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return _params(node), f"{fname}:{node.lineno}"
        return None, f"{target} is not a function in {fname}"
    return None, "module not found in wheel"


def check(patches: List[Patch], wheel: str | Path, version: str) -> List[str]:
    """Problems (empty when every applicable target exists with the expected parameters)."""
    src = WheelSource(wheel)
    problems = []
    for p in patches:
        if not p.applies_to(version):
            continue
        params, where = locate(src, p.target)
        if params is None:
            problems.append(f"SGLang {version}: {p.target}: {where}")
        elif p.params is not None and params[: len(p.params)] != tuple(p.params):
            problems.append(f"SGLang {version}: {p.target} ({where}) has parameters {list(params)}, "
                            f"expected to start with {list(p.params)}")
    return problems
