"""The registry's ``property_after`` kind (property swap), on throwaway classes."""

import sys
import types

import pytest

from sglang_replayssm.patches.registry import (
    MARKER, Patch, PatchError, apply, is_patched, resolve, status, unapply_all, verify,
)

MOD = "replayssm_fake_prop_mod"


@pytest.fixture
def fake():
    unapply_all()
    mod = types.ModuleType(MOD)

    class Base:
        def __init__(self, n):
            self.n = n

        @property
        def size(self):
            """bytes per request"""
            return self.n * 10

        @size.setter
        def size(self, v):
            self.n = v // 10

        def method(self):
            return 1

    class Child(Base):
        pass

    mod.Base, mod.Child = Base, Child
    sys.modules[MOD] = mod
    yield mod
    unapply_all()
    sys.modules.pop(MOD, None)


def test_property_after_swaps_keeps_wrapped_setter_doc_and_restores(fake):
    Base = fake.Base
    original = Base.__dict__["size"]
    p = Patch(f"{MOD}.Base.size", "property_after", lambda v, self: v + 1, versions=">=0", params=("self",))
    with pytest.raises(PatchError, match="not patched"):
        verify([p], version="0.5.17")
    assert apply([p], version="0.5.17") == [p.target]
    new = Base.__dict__["size"]
    assert isinstance(new, property) and new is not original
    assert new.fget.__wrapped__ is original.fget and getattr(new.fget, MARKER) == p.target
    assert new.fset is original.fset and new.__doc__ == "bytes per request"
    b = Base(3)
    assert b.size == 31 and fake.Child(2).size == 21  # subclasses see the swap
    b.size = 70
    assert b.n == 7 and b.size == 71
    assert apply([p], version="0.5.17") == []  # idempotent: no double wrapping
    assert Base.__dict__["size"] is new and Base(1).size == 11
    verify([p], version="0.5.17")
    assert status([p], version="0.5.17")[0][1] == "patched"
    unapply_all()
    assert Base.__dict__["size"] is original and Base(3).size == 30


def test_hook_returning_none_keeps_value(fake):
    apply([Patch(f"{MOD}.Base.size", "property_after", lambda v, self: None, versions=">=0")], version="0.5.17")
    assert fake.Base(4).size == 40


def test_inherited_property_is_patched_on_the_subclass_and_removed_on_undo(fake):
    p = Patch(f"{MOD}.Child.size", "property_after", lambda v, self: -v, versions=">=0")
    apply([p], version="0.5.17")
    assert "size" in fake.Child.__dict__ and fake.Child(2).size == -20 and fake.Base(2).size == 20
    unapply_all()
    assert "size" not in fake.Child.__dict__ and fake.Child(2).size == 20


def test_function_kinds_refuse_a_property_and_roll_back(fake):
    good = Patch(f"{MOD}.Base.method", "after", lambda r, self: r + 1, versions=">=0")
    bad = Patch(f"{MOD}.Base.size", "after", lambda r, self: r, versions=">=0")
    original_method = fake.Base.__dict__["method"]
    with pytest.raises(PatchError, match="property_after"):
        apply([good, bad], version="0.5.17")
    assert fake.Base.__dict__["method"] is original_method, "half-patched after a failure"
    assert isinstance(fake.Base.__dict__["size"], property)
    assert status([bad], version="0.5.17")[0][1] == "missing"


def test_property_kind_refuses_a_method_and_propagation(fake):
    p = Patch(f"{MOD}.Base.method", "property_after", lambda v, self: v, versions=">=0")
    with pytest.raises(PatchError, match="needs a property"):
        apply([p], version="0.5.17")
    assert not is_patched(fake.Base.__dict__["method"], p.target)
    with pytest.raises(ValueError, match="cannot propagate"):
        Patch(f"{MOD}.Base.size", "property_after", lambda v, self: v, propagate=True)


def test_property_params_are_checked(fake):
    assert resolve(f"{MOD}.Base.size").func is fake.Base.__dict__["size"].fget
    p = Patch(f"{MOD}.Base.size", "property_after", lambda v, self: v, versions=">=0", params=("self", "x"))
    with pytest.raises(PatchError, match="signature changed"):
        apply([p], version="0.5.17")
