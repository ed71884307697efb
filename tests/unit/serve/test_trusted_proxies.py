"""Who a trusted front-end's request is (localserve/serve/trusted_proxies.py): the header that names
the person, the normalized name, an id keeping its first name (kept in the store of people,
ops/people.py, before it is used), the bound per front-end, and that no other caller's header
counts. Through the HTTP API: tests/e2e/test_trusted_frontends.py and test_people_store.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from starlette.requests import Request

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.ops.people import DATABASE, PeopleStore
from localserve.serve.trusted_proxies import People, PersonRefused, on_behalf_of, person_name

USERS = {"openwebui": "owui-connection-key", "kate": "kates-own-token"}


@pytest.fixture
def store(tmp_path):
    opened = PeopleStore(tmp_path / DATABASE)
    yield opened
    opened.close()


@dataclass
class Door:
    people: People
    config: ServerConfig = field(
        default_factory=lambda: ServerConfig(trusted_frontends=["openwebui"])
    )
    access: Access = field(default_factory=lambda: Access(USERS))


def behalf(door: Door, request: Request, user: str) -> str:
    return asyncio.run(on_behalf_of(door, request, user))


def person(people: People, name: str, account: str | None, limit: int = 8) -> str:
    return asyncio.run(people.person("openwebui", name, account, limit, "H"))


def request(*headers: tuple[str, str]) -> Request:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def test_a_trusted_frontend_names_its_person_and_others_are_themselves(store):
    door = Door(People(store))
    alice = request(("X-OpenWebUI-User-Name", "Alice"), ("X-OpenWebUI-User-Id", "id-a"))
    assert behalf(door, alice, "openwebui") == "openwebui/alice"
    assert behalf(door, request(), "openwebui") == "openwebui"  # no header: itself
    assert behalf(door, alice, "kate") == "kate"  # not trusted: ignored
    open_door = Door(People(store), access=Access({}))
    assert behalf(open_door, alice, "openwebui") == "openwebui"  # no tokens: ignored
    generic = request(("X-Localserve-User", "Bob"), ("X-OpenWebUI-User-Name", "Robert"))
    assert behalf(door, generic, "openwebui") == "openwebui/bob"  # localserve's first
    only_id = request(("X-OpenWebUI-User-Id", "ID-C"))
    assert behalf(door, only_id, "openwebui") == "openwebui/id-c"


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


def test_a_header_given_twice_or_too_long_is_refused(store):
    door = Door(People(store))
    twice = request(("X-Localserve-User", "a"), ("X-Localserve-User", "b"))
    with pytest.raises(PersonRefused, match="X-Localserve-User: given 2 times"):
        behalf(door, twice, "openwebui")
    with pytest.raises(PersonRefused, match="X-OpenWebUI-User-Id: longer than 128"):
        behalf(door, request(("X-OpenWebUI-User-Id", "i" * 129)), "openwebui")
    with pytest.raises(PersonRefused, match="X-Localserve-User: longer than 1024"):
        behalf(door, request(("X-Localserve-User", "%41" * 400)), "openwebui")


def test_an_id_keeps_its_first_name_and_a_name_keeps_its_id(store):
    people = People(store)
    assert person(people, "alice", "id-a") == "alice"
    assert person(people, "queen", "id-a") == "alice"  # renamed: still her
    with pytest.raises(PersonRefused, match="H: 'alice' is another account's name") as e:
        person(people, "alice", "id-b")
    assert e.value.status == 403
    assert person(people, "carl", None) == "carl"  # named without an id
    assert person(people, "carl", None) == "carl"
    assert person(people, "carl", "id-c") == "carl"  # its id from now on
    with pytest.raises(PersonRefused):
        person(people, "carl", "id-d")
    assert people.num_people("openwebui") == 2


def test_a_name_alone_is_refused_when_an_id_has_it(store):
    people = People(store)
    person(people, "dave", "id-dave")
    with pytest.raises(PersonRefused, match="'dave' is an account's name here: send its X-Op") as e:
        person(people, "dave", None)
    assert e.value.status == 403
    door = Door(people)
    alone = request(("X-Localserve-User", "Dave"))
    with pytest.raises(PersonRefused, match="X-Localserve-User: 'dave' is an account's name"):
        behalf(door, alone, "openwebui")
    with_id = request(("X-Localserve-User", "Dave"), ("X-OpenWebUI-User-Id", "id-dave"))
    assert behalf(door, with_id, "openwebui") == "openwebui/dave"


def test_the_bindings_are_kept_before_they_are_used_and_read_back(store):
    people = People(store)
    person(people, "dave", "id-dave")
    person(people, "zoë", None)
    assert store.bindings() == [("openwebui", "dave", "id-dave"), ("openwebui", "zoë", None)]
    again = People(store)  # the server restarted on the same state dir
    assert person(again, "the real dave", "id-dave") == "dave"
    with pytest.raises(PersonRefused, match="another account's name"):
        person(again, "dave", "id-mallory")
    with pytest.raises(PersonRefused, match="an account's name"):
        person(again, "dave", None)
    assert person(again, "zoë", None) == "zoë" and again.num_people("openwebui") == 2


def test_people_named_at_once_are_bound_one_at_a_time(store):
    people = People(store)

    async def at_once():
        asks = [people.person("openwebui", "dave", f"id-{i % 3}", 8, "H") for i in range(9)]
        return await asyncio.gather(*asks, return_exceptions=True)

    got = asyncio.run(at_once())
    assert got[0] == "dave" and got[3] == "dave" and got[6] == "dave"  # id-0's, asked first
    assert all(isinstance(g, PersonRefused) for i, g in enumerate(got) if i % 3)
    assert store.bindings() == [("openwebui", "dave", "id-0")]


def test_a_binding_whose_client_went_away_is_still_learnt(store):
    people = People(store)

    async def gone():
        asked = asyncio.ensure_future(people.person("openwebui", "dave", "id-dave", 8, "H"))
        await asyncio.sleep(0)  # the binding is on its way to the store's thread
        asked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asked
        for _ in range(500):
            if people.num_people("openwebui"):
                return
            await asyncio.sleep(0.01)

    asyncio.run(gone())
    assert store.bindings() == [("openwebui", "dave", "id-dave")]
    assert person(people, "dave", "id-dave") == "dave"  # known: not written a second time


def test_a_new_person_the_store_cannot_keep_is_refused_and_known_ones_go_on(tmp_path: Path):
    store = PeopleStore(tmp_path / DATABASE)
    people = People(store)
    person(people, "dave", "id-dave")
    store.close()  # as good as a store that cannot be written: no binding gets in
    with pytest.raises(PersonRefused, match="new people cannot be recorded now") as e:
        person(people, "erin", "id-erin")
    assert e.value.status == 503 and e.value.retry_after_s > 0
    assert person(people, "dave", "id-dave") == "dave"
    assert people.num_people("openwebui") == 1  # erin is not known: not served unkept
    with pytest.raises(PersonRefused, match="keeps no people") as e:
        person(People(None), "dave", "id-dave")
    assert e.value.status == 503


def test_past_the_bound_new_people_are_refused_and_known_ones_go_on(store):
    people = People(store)
    for i in range(3):
        person(people, f"p{i}", f"id-{i}", 3)
    with pytest.raises(PersonRefused, match="max_people_per_frontend") as e:
        person(people, "p3", "id-3", 3)
    assert e.value.status == 403
    with pytest.raises(PersonRefused):
        person(people, "p3", None, 3)
    assert person(people, "p1", "id-1", 3) == "p1"
    other = asyncio.run(people.person("other", "p3", None, 3, "H"))
    assert other == "p3"  # each front-end its own bound
    assert people.num_people("openwebui") == 3 and len(people._named["openwebui"].names) == 3
    with pytest.raises(PersonRefused, match="max_people_per_frontend"):
        person(People(store), "p3", "id-3", 3)  # and after a restart too


@pytest.mark.parametrize(
    "alike",
    [
        "d\u0430ve",  # a Cyrillic а
        "\u0501ave",  # a Cyrillic ԁ
        "dav\u0435",  # a Cyrillic е
        "d\u03b1ve",  # a Greek α
    ],
)
def test_a_name_that_looks_like_a_bound_one_is_refused(store, alike):
    """dave is bound; a new name with his skeleton (UTS #39) would show as dave on the monitor
    and in the usage report while being someone else: a 403 naming him. Known people, and
    names that only share letters, go on; the refusal holds after a restart too."""
    people = People(store)
    assert person(people, "dave", "id-dave") == "dave"
    with pytest.raises(PersonRefused, match=f"H: '{alike}' looks like 'dave'") as e:
        person(people, alike, "id-mallory")
    assert e.value.status == 403
    with pytest.raises(PersonRefused, match="looks like 'dave'"):
        person(people, alike, None)  # without an id too
    assert person(people, "dave", "id-dave") == "dave"
    assert person(people, "davey", "id-davey") == "davey"  # another name: fine
    assert person(people, "jürgen", "id-j") == "jürgen"  # not ASCII, nobody's look-alike: fine
    with pytest.raises(PersonRefused, match="looks like 'dave'"):
        person(People(store), alike, "id-mallory")  # read back after a restart
