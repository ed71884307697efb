"""The seam's two sides keep up with it: the fake Frontdoor (tests/support/fake_frontdoor.py) and
the real one (serve/model_door.py's ModelDoor) have every member of the `Frontdoor` Protocol, each
method with the same parameters, the same kind (a coroutine or not) and the same annotations, so
the front doors' unit tests cannot pass on a door the real one is not, and the real door cannot
drift from what the doors were written against. When the seam changes, this says who lags."""

from __future__ import annotations

import inspect

import pytest

from localserve.serve.model_door import ModelDoor
from tests.support.fake_frontdoor import FakeFrontdoor, Frontdoor

SIDES = [FakeFrontdoor, ModelDoor]


def _members(cls) -> dict[str, object]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


@pytest.mark.parametrize("side", SIDES, ids=lambda c: c.__name__)
def test_every_member_of_the_seam_is_there(side):
    members = {name for klass in side.__mro__ for name in vars(klass)}
    if side is FakeFrontdoor:  # the fake sets some as plain attributes
        members |= set(vars(FakeFrontdoor()))
    missing = [name for name in _members(Frontdoor) if name not in members]
    assert missing == []


@pytest.mark.parametrize("side", SIDES, ids=lambda c: c.__name__)
def test_its_methods_take_the_seams_parameters_and_are_coroutines_where_it_has_them(side):
    differ = []
    for name, member in _members(Frontdoor).items():
        real = getattr(side, name, None)
        if not inspect.isfunction(member) or real is None:
            continue  # a property (its value is enough), or missing (the test above says so)
        mine, seam = inspect.signature(real), inspect.signature(member)
        if list(mine.parameters) != list(seam.parameters):
            differ.append(f"{name}: {mine} != {seam}")
        if inspect.iscoroutinefunction(real) != inspect.iscoroutinefunction(member):
            differ.append(f"{name}: a coroutine on one side only")
        if side is ModelDoor and mine.return_annotation != seam.return_annotation:
            differ.append(f"{name}: returns {mine.return_annotation}, not {seam.return_annotation}")
    assert differ == []


def test_the_real_doors_properties_are_properties():
    differ = [
        name
        for name, member in _members(Frontdoor).items()
        if isinstance(member, property) and not isinstance(getattr(ModelDoor, name), property)
    ]
    assert differ == []


def test_no_member_of_the_seam_returns_an_untyped_dict():
    untyped = [
        name
        for name, member in _members(Frontdoor).items()
        if inspect.isfunction(member)
        and "dict]" in str(inspect.signature(member).return_annotation)
    ]
    assert untyped == []
