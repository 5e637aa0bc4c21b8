"""Declarative, verified patch registry.

A :class:`Patch` names a dotted SGLang target, a hook kind, the SGLang versions it
applies to, the parameters the target must have, and the hook.  :func:`apply` installs
every applicable patch or none (on any failure the ones already installed are rolled
back), is idempotent, and keeps ``__wrapped__`` plus a marker on each patched
callable (or, for the ``property_after`` kind, on a property's getter).
:func:`verify` re-resolves every target and raises :class:`PatchError`
naming the target and the installed SGLang version when anything is missing, moved,
or not patched: the package never runs half-patched.

No math here and no SGLang import at module import time.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

logger = logging.getLogger("sglang_replayssm.patches")

MARKER = "__replayssm_patch__"
KINDS = ("before", "after", "around", "replace", "property_after")
# kinds that swap a ``property`` (class attribute) for a new property instead of
# wrapping a function: wrapping a property's object would turn it into a method
PROPERTY_KINDS = ("property_after",)
_LOCK = threading.RLock()


class PatchError(RuntimeError):
    """A patch target is missing, moved, changed signature, or is not patched."""


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return SGLANG_MISSING


SGLANG_MISSING = "not installed"


def version_matches(version: str, spec: str) -> bool:
    """PEP 440 match of ``version`` against ``spec`` (e.g. ``">=0.5.15,<0.6"``), by ``packaging``.

    Pre-releases (``0.5.15rc1``, ``0.5.18.dev0``) match only a spec that names a pre-release, so a
    release candidate is never taken for the release whose code the patches were checked against.
    A version string that is not PEP 440 (or "not installed") matches nothing; a bad spec raises."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        specs = SpecifierSet(spec)
    except InvalidSpecifier as e:
        raise ValueError(f"bad version spec {spec!r}: {e}") from None
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return specs.contains(v, prereleases=bool(specs.prereleases))


@dataclass(frozen=True)
class Patch:
    """One hook on one SGLang target.

    kind: ``before`` (hook(*a, **k) -> (a, k) | None), ``after`` (hook(result, *a, **k)
    -> new result | None), ``around`` (hook(original, *a, **k)), ``replace``
    (hook(*a, **k); the original stays reachable as ``__wrapped__``),
    ``property_after`` (target is a ``property`` on a class; hook(value, self) -> new
    value | None; the class attribute is replaced by a new property whose getter keeps
    the original getter as ``__wrapped__``; setter/deleter/doc are kept).
    params: the leading parameter names the target must have (checked before patching).
    propagate: also rewrite module-global ``from X import name`` bindings of a
    module-level function (in modules already imported).
    """

    target: str
    kind: str
    hook: Callable
    versions: str = ">=0.5.15,<0.6"
    params: Optional[Tuple[str, ...]] = None
    description: str = ""
    propagate: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"patch {self.target}: kind {self.kind!r} not in {KINDS}")
        if self.target.count(".") < 1:
            raise ValueError(f"patch target {self.target!r} must be a dotted path")
        if self.kind in PROPERTY_KINDS and self.propagate:
            raise ValueError(f"patch {self.target}: kind {self.kind!r} cannot propagate (a property is "
                             "a class attribute, never bound by `from X import`)")

    def applies_to(self, version: str) -> bool:
        return version_matches(version, self.versions)


@dataclass
class Resolved:
    owner: Any                 # module or class that holds the attribute
    name: str
    raw: Any                   # owner.__dict__ entry (may be staticmethod/classmethod/property)
    func: Callable             # the underlying function (a property's getter)


def resolve(target: str) -> Resolved:
    """Import the longest module prefix of ``target`` and walk the rest as attributes."""
    parts = target.split(".")
    module = None
    i = len(parts) - 1
    err: Optional[BaseException] = None
    while i > 0:
        modname = ".".join(parts[:i])
        try:
            module = importlib.import_module(modname)
            break
        except ModuleNotFoundError as e:
            if e.name and not modname.startswith(e.name) and e.name != modname:
                err = e  # the module exists but one of its own imports is missing
                break
            i -= 1
        except Exception as e:  # import-time failure inside SGLang
            err = e
            break
    if module is None:
        raise PatchError(f"target {target}: module not importable with SGLang {sglang_version()}"
                         + (f" ({type(err).__name__}: {err})" if err else ""))
    owner: Any = module
    for p in parts[i:-1]:
        if not hasattr(owner, p):
            raise PatchError(f"target {target}: {p!r} not found in {getattr(owner, '__name__', owner)} "
                             f"(SGLang {sglang_version()})")
        owner = getattr(owner, p)
    name = parts[-1]
    if isinstance(owner, type):
        raw = None
        for klass in owner.__mro__:
            if name in klass.__dict__:
                raw = klass.__dict__[name]
                break
    else:
        raw = getattr(owner, name, None)
    if raw is None:
        raise PatchError(f"target {target}: attribute {name!r} not found (SGLang {sglang_version()})")
    if isinstance(raw, property):
        func = raw.fget
    else:
        func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if not callable(func):
        raise PatchError(f"target {target}: {name!r} is not callable (SGLang {sglang_version()})")
    return Resolved(owner, name, raw, func)


def _check_params(patch: Patch, func: Callable) -> None:
    if patch.params is None:
        return
    base = inspect.unwrap(func)
    try:
        names = tuple(inspect.signature(base).parameters)
    except (TypeError, ValueError) as e:
        raise PatchError(f"target {patch.target}: cannot read its signature ({e}); SGLang {sglang_version()}")
    if names[: len(patch.params)] != tuple(patch.params):
        raise PatchError(
            f"target {patch.target}: signature changed in SGLang {sglang_version()}: "
            f"expected parameters starting with {list(patch.params)}, found {list(names)}")


def _check_kind(patch: Patch, r: Resolved) -> None:
    is_prop = isinstance(r.raw, property)
    if patch.kind in PROPERTY_KINDS and not is_prop:
        raise PatchError(f"target {patch.target}: kind {patch.kind!r} needs a property, found "
                         f"{type(r.raw).__name__} (SGLang {sglang_version()})")
    if is_prop and patch.kind not in PROPERTY_KINDS:
        raise PatchError(f"target {patch.target} is a property: use kind 'property_after' "
                         f"(kind {patch.kind!r} would turn it into a method; SGLang {sglang_version()})")


def _make_wrapper(patch: Patch, original: Callable) -> Callable:
    hook = patch.hook
    if patch.kind == "property_after":
        def wrapper(self):
            result = original(self)
            r = hook(result, self)
            return result if r is None else r
    elif patch.kind == "before":
        def wrapper(*args, **kwargs):
            r = hook(*args, **kwargs)
            if r is not None:
                args, kwargs = r
            return original(*args, **kwargs)
    elif patch.kind == "after":
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            r = hook(result, *args, **kwargs)
            return result if r is None else r
    elif patch.kind == "around":
        def wrapper(*args, **kwargs):
            return hook(original, *args, **kwargs)
    else:  # replace
        def wrapper(*args, **kwargs):
            return hook(*args, **kwargs)
    functools.update_wrapper(wrapper, original)
    wrapper.__wrapped__ = original
    setattr(wrapper, MARKER, patch.target)
    return wrapper


def is_patched(func: Any, target: str) -> bool:
    if isinstance(func, property):
        func = func.fget
    f = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
    return getattr(f, MARKER, None) == target and hasattr(f, "__wrapped__")


def _propagate(original: Callable, new: Callable, skip: Any) -> List[Tuple[Any, str]]:
    done = []
    for mod in list(sys.modules.values()):
        if mod is None or mod is skip or not isinstance(mod, types.ModuleType):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for k, v in items:
            if v is original:
                try:
                    setattr(mod, k, new)
                    done.append((mod, k))
                except (AttributeError, TypeError):
                    pass
    return done


@dataclass
class _Applied:
    patch: Patch
    owner: Any
    name: str
    raw_before: Any
    had_own: bool
    bindings: List[Tuple[Any, str]] = field(default_factory=list)


_APPLIED: Dict[str, _Applied] = {}


def applicable(patches: Iterable[Patch], version: Optional[str] = None) -> List[Patch]:
    version = version or sglang_version()
    return [p for p in patches if p.applies_to(version)]


def supported_range(patches: Iterable[Patch]) -> str:
    """The SGLang versions ``patches`` declare, as one PEP 440 range where their ``>=A,<B`` specs
    join up (``">=0.5.15,<0.6"``), else the disjoint pieces or distinct specs joined by " or "."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    specs = sorted({p.versions for p in patches})
    spans = []
    for spec in specs:
        ops = {s.operator: s.version for s in SpecifierSet(spec)}
        if set(ops) != {">=", "<"} or len(SpecifierSet(spec)) != 2:
            return " or ".join(specs)
        spans.append((Version(ops[">="]), Version(ops["<"]), ops[">="], ops["<"]))
    merged: List[list] = []
    for lo, hi, lo_s, hi_s in sorted(spans):
        if merged and lo <= merged[-1][1]:
            if hi > merged[-1][1]:
                merged[-1][1], merged[-1][3] = hi, hi_s
        else:
            merged.append([lo, hi, lo_s, hi_s])
    return " or ".join(f">={lo_s},<{hi_s}" for _, _, lo_s, hi_s in merged)


# The SGLang releases the seam and pool tests run against (tests/, eval/sglang_versions.py): 0.5.17 installed,
# 0.5.15's and 0.5.23's classes checked from their wheels. A release between them is refused, not guessed:
# SGLang moves internals between patch releases (0.5.23 moved the request's KV record, the radix cache and
# the model config's home), and a moved seam computes silently wrong instead of failing.
TESTED_SGLANG = ("0.5.15", "0.5.17", "0.5.23")
# the release run end to end on an H200 (torch 2.11 there; 0.5.23 needs torch 2.14.1)
RECOMMENDED_SGLANG = "0.5.17"


def is_tested_release(version: str, releases: Iterable[str] = TESTED_SGLANG) -> bool:
    """Whether ``version`` is one of ``releases`` or a ``.postN`` of one (a local label such as ``+cu128`` is
    a build of the same code and passes). Pre-/dev-releases and anything not PEP 440 do not."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return False
    if v.is_prerelease or v.is_devrelease:
        return False
    return any(Version(v.base_version) == Version(r) for r in releases)


def _join(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def require_applicable(patches: Sequence[Patch], version: Optional[str] = None) -> List[Patch]:
    """The patches that apply to ``version``; :class:`PatchError` naming the installed SGLang and the
    supported releases when SGLang is missing, is not one of the tested releases (:data:`TESTED_SGLANG`,
    ``.postN`` included) inside the patches' range, or no patch applies (enabled with nothing to patch
    would be stock SGLang reported as patched)."""
    version = version or sglang_version()
    supported = supported_range(patches) if patches else "none"
    tested = [r for r in TESTED_SGLANG if applicable(patches, r)]
    names = f"{_join(tested)} (and their .postN releases)" if tested else "no tested release"
    install = f"pip install 'sglang=={RECOMMENDED_SGLANG if RECOMMENDED_SGLANG in tested else tested[-1]}'" \
        if tested else "no SGLang release fits"
    if version == SGLANG_MISSING:
        raise PatchError(f"SGLang is not installed; sglang_replayssm patches SGLang {names}, within "
                         f"{supported} ({install})")
    todo = applicable(patches, version)
    if not todo or not is_tested_release(version, tested):
        raise PatchError(f"SGLang {version} is installed but sglang_replayssm supports SGLang {names} only, "
                         f"the releases its patches are tested on within {supported}; untested and pre-releases "
                         f"are refused, so nothing would be patched ({install})")
    return todo


def apply(patches: Sequence[Patch], version: Optional[str] = None) -> List[str]:
    """Install every applicable patch, all or nothing. Returns the targets newly patched."""
    version = version or sglang_version()
    todo = applicable(patches, version)
    targets = [p.target for p in todo]
    if len(set(targets)) != len(targets):
        raise PatchError(f"duplicate patch targets in registry: {sorted(t for t in targets if targets.count(t) > 1)}")
    newly: List[_Applied] = []
    with _LOCK:
        try:
            for p in todo:
                r = resolve(p.target)
                if is_patched(r.raw, p.target):
                    continue
                _check_kind(p, r)
                _check_params(p, r.func)
                wrapper = _make_wrapper(p, r.func)
                if isinstance(r.raw, property):
                    new_raw = property(wrapper, r.raw.fset, r.raw.fdel, r.raw.__doc__)
                elif isinstance(r.raw, (staticmethod, classmethod)):
                    new_raw = type(r.raw)(wrapper)
                else:
                    new_raw = wrapper
                had_own = isinstance(r.owner, type) and r.name in r.owner.__dict__
                rec = _Applied(p, r.owner, r.name, r.raw, had_own)
                setattr(r.owner, r.name, new_raw)
                if p.propagate and isinstance(r.owner, types.ModuleType):
                    rec.bindings = _propagate(r.func, wrapper, r.owner)
                newly.append(rec)
                _APPLIED[p.target] = rec
                logger.info("sglang_replayssm patched %s (%s)%s", p.target, p.kind,
                            f" + {len(rec.bindings)} imported binding(s)" if rec.bindings else "")
        except BaseException:
            for rec in reversed(newly):
                _undo(rec)
            raise
    return [rec.patch.target for rec in newly]


def _undo(rec: _Applied) -> None:
    if rec.had_own or not isinstance(rec.owner, type):
        setattr(rec.owner, rec.name, rec.raw_before)
    else:
        delattr(rec.owner, rec.name)
    orig = rec.raw_before.__func__ if isinstance(rec.raw_before, (staticmethod, classmethod)) else rec.raw_before
    for mod, k in rec.bindings:
        setattr(mod, k, orig)
    _APPLIED.pop(rec.patch.target, None)


def unapply_all() -> None:
    """Restore every original (tests and `enable(False)`)."""
    with _LOCK:
        for rec in reversed(list(_APPLIED.values())):
            _undo(rec)


def verify(patches: Sequence[Patch], version: Optional[str] = None) -> None:
    """Raise PatchError unless every applicable patch is in place."""
    version = version or sglang_version()
    problems = []
    for p in applicable(patches, version):
        try:
            r = resolve(p.target)
        except PatchError as e:
            problems.append(str(e))
            continue
        if not is_patched(r.raw, p.target):
            problems.append(f"target {p.target}: not patched")
    if problems:
        raise PatchError(f"sglang_replayssm patch verification failed on SGLang {version}:\n  "
                         + "\n  ".join(problems))


def status(patches: Sequence[Patch], version: Optional[str] = None) -> List[Tuple[str, str, str]]:
    """(target, state, detail) for each patch: patched / resolved / missing / skipped."""
    version = version or sglang_version()
    rows = []
    for p in patches:
        if version == SGLANG_MISSING:
            rows.append((p.target, "skipped", "SGLang not installed"))
            continue
        if not p.applies_to(version):
            rows.append((p.target, "skipped", f"not for SGLang {version} (applies to {p.versions})"))
            continue
        try:
            r = resolve(p.target)
            _check_kind(p, r)
            _check_params(p, r.func)
        except PatchError as e:
            rows.append((p.target, "missing", str(e)))
            continue
        rows.append((p.target, "patched" if is_patched(r.raw, p.target) else "resolved", p.description))
    return rows
