"""Who a trusted front-end's request is (localserve/serve/frontends.py): the header that names
the person, the normalized name, an id keeping its first name, the bound per front-end, and
that no other caller's header counts. Through the HTTP API: tests/e2e/test_trusted_frontends.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from starlette.requests import Request

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.serve.frontends import People, PersonRefused, on_behalf_of, person_name

USERS = {"openwebui": "owui-connection-key", "kate": "kates-own-token"}


@dataclass
class Door:
    config: ServerConfig = field(
        default_factory=lambda: ServerConfig(trusted_frontends=["openwebui"])
    )
    access: Access = field(default_factory=lambda: Access(USERS))
    people: People = field(default_factory=People)


def request(*headers: tuple[str, str]) -> Request:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def test_a_trusted_frontend_names_its_person_and_others_are_themselves():
    door = Door()
    alice = request(("X-OpenWebUI-User-Name", "Alice"), ("X-OpenWebUI-User-Id", "id-a"))
    assert on_behalf_of(door, alice, "openwebui") == "openwebui/alice"
    assert on_behalf_of(door, request(), "openwebui") == "openwebui"  # no header: itself
    assert on_behalf_of(door, alice, "kate") == "kate"  # not trusted: ignored
    open_door = Door(access=Access({}))
    assert on_behalf_of(open_door, alice, "openwebui") == "openwebui"  # no tokens: ignored
    generic = request(("X-Localserve-User", "Bob"), ("X-OpenWebUI-User-Name", "Robert"))
    assert on_behalf_of(door, generic, "openwebui") == "openwebui/bob"  # localserve's first
    only_id = request(("X-OpenWebUI-User-Id", "ID-C"))
    assert on_behalf_of(door, only_id, "openwebui") == "openwebui/id-c"


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("Alice", "alice"),
        ("Alice%20Smith", "alice smith"),
        ("  J%C3%BCrgen   M%C3%BCller ", "jürgen müller"),  # Open WebUI's quote(name, safe=" ")
        ("Jürgen".encode().decode("latin-1"), "jürgen"),  # UTF-8 sent as it is
        (
            "ＡＬＩＣＥ".encode().decode("latin-1"),
            "alice",
        ),  # NFKC: full-width letters are the plain ones
        ("a\tb", "a b"),
        ("100%", None),  # not percent-encoding: kept
    ],
)
def test_names_are_decoded_normalized_and_lower_case(raw, name):
    if name is None:
        assert person_name(raw, "X") == raw
        return
    assert person_name(raw, "X") == name


@pytest.mark.parametrize("raw", ["", "%20", "a%0Ab%00", "%ff", "x" * 65, "%E2%80%AE"])
def test_a_bad_name_is_refused_naming_the_header(raw):
    with pytest.raises(PersonRefused) as e:
        person_name(raw, "X-OpenWebUI-User-Name")
    assert e.value.status == 400 and e.value.message.startswith("X-OpenWebUI-User-Name: ")


def test_a_header_given_twice_or_too_long_is_refused():
    door = Door()
    twice = request(("X-Localserve-User", "a"), ("X-Localserve-User", "b"))
    with pytest.raises(PersonRefused, match="X-Localserve-User: given 2 times"):
        on_behalf_of(door, twice, "openwebui")
    with pytest.raises(PersonRefused, match="X-OpenWebUI-User-Id: longer than 128"):
        on_behalf_of(door, request(("X-OpenWebUI-User-Id", "i" * 129)), "openwebui")
    with pytest.raises(PersonRefused, match="X-Localserve-User: longer than 1024"):
        on_behalf_of(door, request(("X-Localserve-User", "%41" * 400)), "openwebui")


def test_an_id_keeps_its_first_name_and_a_name_keeps_its_id():
    people = People()
    assert people.person("openwebui", "alice", "id-a", 8, "H") == "alice"
    assert people.person("openwebui", "queen", "id-a", 8, "H") == "alice"  # renamed: still her
    with pytest.raises(PersonRefused, match="H: 'alice' is another account's name") as e:
        people.person("openwebui", "alice", "id-b", 8, "H")
    assert e.value.status == 403
    assert people.person("openwebui", "alice", None, 8, "H") == "alice"  # no id: the name
    assert people.person("openwebui", "carl", None, 8, "H") == "carl"
    assert people.person("openwebui", "carl", "id-c", 8, "H") == "carl"  # its id from now on
    with pytest.raises(PersonRefused):
        people.person("openwebui", "carl", "id-d", 8, "H")
    assert people.num_people("openwebui") == 2


def test_past_the_bound_new_people_are_refused_and_known_ones_go_on():
    people = People()
    for i in range(3):
        people.person("openwebui", f"p{i}", f"id-{i}", 3, "H")
    with pytest.raises(PersonRefused, match="max_people_per_frontend") as e:
        people.person("openwebui", "p3", "id-3", 3, "H")
    assert e.value.status == 403
    with pytest.raises(PersonRefused):
        people.person("openwebui", "p3", None, 3, "H")
    assert people.person("openwebui", "p1", "id-1", 3, "H") == "p1"
    assert people.person("other", "p3", None, 3, "H") == "p3"  # each front-end its own bound
    assert people.num_people("openwebui") == 3 and len(people._named["openwebui"].names) == 3
