"""The fake Frontdoor (tests/support/fake_frontdoor.py) keeps up with the seam it stands for:
every member of the `Frontdoor` Protocol is there, a method with the same parameters and the
same kind (a coroutine or not), so the front doors' unit tests cannot pass on a door the real
one is not. When the seam changes, this says what the fake lacks."""

from __future__ import annotations

import inspect

from tests.support.fake_frontdoor import FakeFrontdoor, Frontdoor


def _members(cls) -> dict[str, object]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


def test_the_fake_has_every_member_of_the_seam():
    door = FakeFrontdoor()
    missing = [name for name in _members(Frontdoor) if not hasattr(door, name)]
    assert missing == []


def test_the_fakes_methods_take_the_seams_parameters_and_are_coroutines_where_it_has_them():
    differ = []
    for name, member in _members(Frontdoor).items():
        fake = getattr(FakeFrontdoor, name, None)
        if not inspect.isfunction(member) or fake is None:
            continue  # a property (its value is enough), or missing (the test above says so)
        if list(inspect.signature(fake).parameters) != list(inspect.signature(member).parameters):
            differ.append(f"{name}: {inspect.signature(fake)} != {inspect.signature(member)}")
        if inspect.iscoroutinefunction(fake) != inspect.iscoroutinefunction(member):
            differ.append(f"{name}: a coroutine on one side only")
    assert differ == []
