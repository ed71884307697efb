"""The store of people trusted front-ends named (localserve/ops/people.py): a binding committed
is there for the next server, a name's first id, a file that is not a store said at start, and a
disk that fills up. Who gets which name is serve/trusted_proxies.py's (tests/unit/serve/
test_trusted_proxies.py); through the server, e2e/test_people_store.py."""

from __future__ import annotations

import asyncio
import logging
import sqlite3

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
