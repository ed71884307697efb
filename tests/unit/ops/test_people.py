"""The store of people trusted front-ends named (localserve/ops/people.py): a binding committed
is there for the next server, a name's first id, a file that is not a store said at start, and a
disk that fills up. Who gets which name is serve/trusted_proxies.py's (tests/unit/serve/
test_trusted_proxies.py); through the server, e2e/test_people_store.py."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

import msgspec
import pytest

from localserve.config import ConfigError, ServerConfig
from localserve.ops.people import DATABASE, Binding, BindingFailed, PeopleStore, PeopleUnusable


def bind(store: PeopleStore, *bindings: Binding) -> None:
    async def each():
        for b in bindings:
            await store.bind(b)

    asyncio.run(each())


def test_a_binding_is_committed_and_read_back_by_the_next_store(tmp_path):
    store = PeopleStore.open(ServerConfig(state_dir=str(tmp_path)))
    assert store.path == tmp_path / DATABASE and store.bindings() == []
    bind(store, Binding("openwebui", "dave", "id-dave"), Binding("gw", "zoë", None))
    db = sqlite3.connect(tmp_path / DATABASE)  # committed: another connection sees it
    assert db.execute("SELECT COUNT(*) FROM people").fetchone() == (2,)
    db.close()
    store.close()
    again = PeopleStore(tmp_path / DATABASE)
    assert again.bindings() == [("openwebui", "dave", "id-dave"), ("gw", "zoë", None)]
    assert (tmp_path / DATABASE).stat().st_mode & 0o777 == 0o600
    again.close()


def test_a_name_takes_its_first_id_and_keeps_it(tmp_path):
    store = PeopleStore(tmp_path / DATABASE)
    bind(store, Binding("gw", "carl", None), Binding("gw", "carl", "id-c"))
    assert store.bindings() == [("gw", "carl", "id-c")]
    bind(store, Binding("gw", "carl", "id-c"))  # again: nothing changes
    with pytest.raises(BindingFailed, match="'carl' of gw is another id's"):
        bind(store, Binding("gw", "carl", "id-d"))  # what this server never asks: a second writer
    with pytest.raises(BindingFailed, match="UNIQUE"):
        bind(store, Binding("gw", "other name", "id-c"))
    assert store.bindings() == [("gw", "carl", "id-c")]
    bind(store, Binding("gw2", "carl", "id-d"))  # each front-end its own names and ids
    assert len(store.bindings()) == 2
    store.close()
    with pytest.raises(BindingFailed, match="shutting down"):
        bind(store, Binding("gw", "erin", None))


def test_a_file_that_is_not_a_store_is_said_at_start(tmp_path):
    path = tmp_path / DATABASE
    path.write_bytes(b"\0garbage" * 512)
    with pytest.raises(PeopleUnusable, match="not a usable store of people.*move it aside"):
        PeopleStore(path)
    path.unlink()
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE t (x)")
    other.commit()
    with pytest.raises(PeopleUnusable, match="some other program's database"):
        PeopleStore(path)
    other.execute("DROP TABLE t")
    other.execute("PRAGMA user_version = 9")
    other.close()
    with pytest.raises(ConfigError, match=f"{path}: written by a newer localserve"):
        PeopleStore(path)


def test_a_full_disk_refuses_new_bindings_once_said_and_room_takes_them_again(small_disk, caplog):
    caplog.set_level(logging.INFO, "localserve.ops.people")
    store = PeopleStore(small_disk.path / DATABASE)
    bind(store, Binding("gw", "dave", "id-dave"))
    small_disk.fill()
    for i in range(3):
        with pytest.raises(BindingFailed, match="full"):
            bind(store, Binding("gw", f"p{i}-" + "x" * 50, f"id-{i}-" + "y" * 100))
    assert "full" in store.problem
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "new people are refused, known ones go on" in errors[0].message
    assert store.bindings() == [("gw", "dave", "id-dave")]
    small_disk.free()
    bind(store, Binding("gw", "erin", "id-erin"))
    assert store.problem == "" and len(store.bindings()) == 2
    store.close()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_store_deleted_or_replaced_under_the_server_refuses_new_people(tmp_path, how, caplog):
    """Committed into a file no longer at its path, a binding would be gone at the next start
    (and the name free for anyone): refused, said once; nothing is written into the new file."""
    path = tmp_path / DATABASE
    store = PeopleStore(path)
    bind(store, Binding("gw", "dave", "id-dave"))
    path.unlink()
    if how == "replaced":
        PeopleStore(path).close()  # a new, empty store where the old one was
    for name in ("erin", "fay"):
        with pytest.raises(BindingFailed, match=f"{path} was {how}.* while serving; restart"):
            bind(store, Binding("gw", name, f"id-{name}"))
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    assert store.problem.startswith(f"{path} was {how}")
    store.close()
    if how == "replaced":
        assert PeopleStore(path).bindings() == []


def usage_rows(state, *users: str) -> None:
    """A usage record with a request of each of `users`."""
    from localserve.ops.usage_database import DATABASE as USAGE
    from localserve.ops.usage_database import connect

    db = connect(state / USAGE)
    for i, user in enumerate(users):
        db.execute(
            "INSERT INTO requests (finished, user, model, request_id, client_id, api, "
            "prompt_tokens, cached_tokens, completion_tokens, finish_reason, day) "
            "VALUES (0, ?, 'm', ?, 'c', 'http', 1, 0, 1, 'stop', '2026-12-06')",
            (user, f"r{i}"),
        )
    db.commit()
    db.close()


def test_an_empty_store_where_the_usage_record_names_a_frontends_people_is_refused(tmp_path):
    config = ServerConfig(state_dir=str(tmp_path), trusted_frontends=["openwebui"])
    usage_rows(tmp_path, "kate", "openwebui", "openwebuiX/eve")  # none of openwebui's people
    PeopleStore.open(config).close()  # nobody was lost
    (tmp_path / DATABASE).unlink()
    usage_rows(tmp_path, "openwebui/dave", "openwebui/dave", "openwebui/erin")
    with pytest.raises(PeopleUnusable) as refused:
        PeopleStore.open(config)
    message = str(refused.value)
    assert "\n" not in message and "names nobody" in message and "2 people of openwebui" in message
    assert "forget_lost_people = true" in message
    forgetting = ServerConfig(**{**msgspec.structs.asdict(config), "forget_lost_people": True})
    store = PeopleStore.open(forgetting)  # as the operator chose: every name new again
    bind(store, Binding("openwebui", "dave", "id-new"))
    store.close()
    PeopleStore.open(config).close()  # it names someone now: not lost
