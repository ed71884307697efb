"""People behind a trusted front-end: whose request it is when Open WebUI (or another front-end
all of a household reaches the server through) asks with its one API key.

A user of the users file listed in `[server] trusted_frontends` may say on whose behalf it asks,
with a header: `X-Localserve-User` (any front-end), or Open WebUI's `X-OpenWebUI-User-Name` and
`X-OpenWebUI-User-Id` (sent with its ENABLE_FORWARD_USER_INFO_HEADERS=true). The request is then
the user `<frontend>/<person>` ("openwebui/alice") everywhere: its own fairness share, quota,
usage rows, prefix-cache isolation and monitor row. Without a header the front-end is itself
the user. From any other caller (another user's key, no key, an open server) the headers are
ignored, silently: they never change who the caller is, and refusing them would break clients
that pass them on without meaning anything by them.

Which header names the person: the id decides who a person is, the name is what they are called
here. Open WebUI lets people change their display name but not their id, so an id keeps the
first name it came with, and a name one id has is refused to another id and to a request that
gives the name without an id (403): renaming oneself to a sister's name, or a front-end sending
her name alone, gets neither her quota nor her cached prompts. The bindings are kept in the
state dir (ops/people.py), each new one committed before its person's request goes on, so they
hold across restarts and crashes: the first id to send "dave" after a restart is not dave. A
new person the store cannot record is refused (503) while known ones go on. The name is shown
(the monitor, `localserve usage`), since an id is a UUID nobody recognizes; without a name the
id is the name. `X-Localserve-User` is taken over Open WebUI's name when both come.

Names are client input: percent-decoded (Open WebUI sends `quote(name, safe=" ")`) as UTF-8,
NFKC-normalized, runs of white space made one space, lower-cased, then 1-MAX_PERSON_NAME
printable characters; each header at most MAX_HEADER_CHARS and given once. A bad one is a 400
naming the header. One front-end names at most `[server] max_people_per_frontend` people, kept
ones included: a new one past it is refused (403 naming the bound) while the known ones go on.
Forgetting idle ones instead would free their names for another id to take. A new name that
looks like one the front-end has already named (the same confusable skeleton, Unicode TS #39,
as ICU's SpoofChecker computes it: "dаve" with a Cyrillic а, "ԁave", "dave" all read "dave") is
refused (403 naming the look-alike): it would show as that person on the monitor and in
`localserve usage` while being someone else.

Tested in tests/unit/serve/test_trusted_proxies.py, tests/e2e/test_trusted_frontends.py and
tests/e2e/test_people_store.py.
"""

from __future__ import annotations

import asyncio
import functools
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import unquote_to_bytes

from starlette.requests import HTTPConnection

from localserve.config import ServerConfig
from localserve.ops.auth import Access
from localserve.ops.people import Binding, BindingFailed, PeopleStore

PERSON_HEADER = "X-Localserve-User"
NAME_HEADER = "X-OpenWebUI-User-Name"
ID_HEADER = "X-OpenWebUI-User-Id"
MAX_PERSON_NAME = 64  # characters of the person's name (the user is "<frontend>/<name>")
MAX_HEADER_CHARS = 1024  # a header's value as sent (percent-encoded UTF-8 takes up to 9 a char)
MAX_ID_CHARS = 128  # Open WebUI's ids are UUIDs (36)
RETRY_BINDING_S = 30  # a new person refused because the store cannot be written: try again then
_SPACES = re.compile(r"\s+")


class PersonRefused(Exception):
    """A trusted front-end's person header that cannot be used: the status and why (the message
    begins with the header's name); each front-end answers it in its own shape."""

    def __init__(self, status: int, header: str, message: str) -> None:
        super().__init__(f"{header}: {message}")
        self.status, self.header, self.message = status, header, f"{header}: {message}"
        self.retry_after_s = RETRY_BINDING_S if status == 503 else 0.0


@dataclass
class _Named:
    """The people one front-end named: each name's id (None: named without one), each id's
    name. At most the bound of names, so at most that many ids."""

    ids: dict[str, str | None] = field(default_factory=dict)  # by name
    names: dict[str, str] = field(default_factory=dict)  # by id
    looks: dict[str, str] = field(default_factory=dict)  # the first name of each skeleton


class People:
    """The people each trusted front-end has named, as `store` keeps them (ops/people.py: read
    at start, each new one committed before it is used), bounded per front-end; owned by the
    event loop, like the rest of admission. Without a store (a server started with no trusted
    front-ends) nobody new can be named."""

    def __init__(self, store: PeopleStore | None) -> None:
        self.store = store
        self._named: dict[str, _Named] = {}  # by front-end: only trusted ones, so bounded
        self._binding = asyncio.Lock()  # one new person at a time: decided on what is kept
        for binding in store.bindings() if store is not None else []:
            self._learn(binding)

    def num_people(self, frontend: str) -> int:
        named = self._named.get(frontend)
        return len(named.ids) if named else 0

    async def person(
        self, frontend: str, name: str, account: str | None, limit: int, header: str
    ) -> str:
        """The name this person goes by here (an id keeps its first name, across restarts);
        PersonRefused: 403 for a name an id has and this request's is another or none, or a
        new person past `limit`; 503 when a new person cannot be recorded."""
        known, new = self._decide(frontend, name, account, limit, header)
        if new is None:
            return known
        # shielded: a client gone while its binding is written still leaves it learnt
        binding = asyncio.ensure_future(self._bind(frontend, name, account, limit, header))
        binding.add_done_callback(lambda done: done.cancelled() or done.exception())
        return await asyncio.shield(binding)

    async def _bind(
        self, frontend: str, name: str, account: str | None, limit: int, header: str
    ) -> str:
        async with self._binding:  # decided again: another request may have bound meanwhile
            known, new = self._decide(frontend, name, account, limit, header)
            if new is None:
                return known
            if self.store is None:
                raise PersonRefused(
                    503, header, "this server keeps no people (started without trusted front-ends)"
                )
            try:
                await self.store.bind(new)  # on disk before the person's request goes on
            except BindingFailed as e:
                raise PersonRefused(
                    503, header, f"new people cannot be recorded now ({e}); known ones go on"
                ) from None
            self._learn(new)
            return known

    def _decide(
        self, frontend: str, name: str, account: str | None, limit: int, header: str
    ) -> tuple[str, Binding | None]:
        """The person's name here, and the binding to commit first (None: known already)."""
        named = self._named.get(frontend) or _Named()
        if account is not None and account in named.names:
            return named.names[account], None
        if name in named.ids:
            owner = named.ids[name]
            if owner is not None and account is None:
                raise PersonRefused(
                    403, header, f"{name!r} is an account's name here: send its {ID_HEADER} too"
                )
            if owner is not None:
                raise PersonRefused(403, header, f"{name!r} is another account's name here")
            if account is None:
                return name, None  # named without an id, as before
        elif (alike := named.looks.get(skeleton(name), name)) != name:
            raise PersonRefused(
                403, header, f"{name!r} looks like {alike!r}, another person's name here"
            )
        elif len(named.ids) >= limit:
            raise PersonRefused(
                403,
                header,
                f"{frontend} has named {limit} people already, the most one front-end may "
                "([server] max_people_per_frontend); known ones go on",
            )
        return name, Binding(frontend, name, account)  # new, or a name's first id

    def _learn(self, binding: Binding) -> None:
        named = self._named.setdefault(binding.frontend, _Named())
        named.ids[binding.name] = binding.account
        named.looks.setdefault(skeleton(binding.name), binding.name)
        if binding.account is not None:
            named.names[binding.account] = binding.name


class Doorkeeper(Protocol):
    """What on_behalf_of reads of the server (door.py's Frontdoor has it all)."""

    @property
    def config(self) -> ServerConfig: ...

    @property
    def access(self) -> Access: ...

    @property
    def people(self) -> People: ...


async def on_behalf_of(door: Doorkeeper, request: HTTPConnection, user: str) -> str:
    """The request's user: `user` (the authenticated caller), or "<user>/<person>" when `user`
    is a trusted front-end naming a person by header. Raises PersonRefused (400 for a bad
    header, 403 past the bounds, 503 when a new person cannot be recorded). Every HTTP
    front-end calls it after authenticating."""
    config = door.config
    if user not in config.trusted_frontends or not door.access.requires_tokens:
        return user
    headers = request.headers
    account = _value(headers.getlist(ID_HEADER.lower()), ID_HEADER, MAX_ID_CHARS)
    if account is not None and not (account.isascii() and account.isprintable()):
        raise PersonRefused(400, ID_HEADER, "printable ASCII characters only")
    for header in (PERSON_HEADER, NAME_HEADER):
        raw = _value(headers.getlist(header.lower()), header, MAX_HEADER_CHARS)
        if raw is not None:
            name = person_name(raw, header)
            break
    else:
        if account is None:
            return user  # the front-end asks for itself
        header, name = ID_HEADER, person_name(account, ID_HEADER)
    limit = config.max_people_per_frontend
    return f"{user}/{await door.people.person(user, name, account, limit, header)}"


def skeleton(name: str) -> str:
    """`name`'s confusable skeleton (Unicode TS #39, by ICU's SpoofChecker): names that look
    alike have the same one. For comparing only, never shown."""
    return _spoof_checker().getSkeleton(0, name)


@functools.cache
def _spoof_checker():
    import icu  # pyicu-wheels: ICU's own implementation of the standard

    return icu.SpoofChecker()


def person_name(raw: str, header: str) -> str:
    """A header's value as a person's name: percent-decoded UTF-8, NFKC, white space runs one
    space, lower case; PersonRefused (400) unless 1-MAX_PERSON_NAME printable characters."""
    try:  # Starlette decodes header bytes as Latin-1: back to the bytes, then UTF-8
        text = unquote_to_bytes(raw.encode("latin-1")).decode("utf-8")
    except UnicodeError:
        raise PersonRefused(400, header, "not UTF-8 (percent-encoded or plain)") from None
    name = _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip().lower()
    if not 0 < len(name) <= MAX_PERSON_NAME or not name.isprintable():
        raise PersonRefused(
            400, header, f"a name of 1-{MAX_PERSON_NAME} printable characters is needed"
        )
    return name


def _value(values: list[str], header: str, limit: int) -> str | None:
    """The header's one value (None when absent); PersonRefused (400) when it came more than
    once or is longer than `limit`."""
    if not values:
        return None
    if len(values) > 1:
        raise PersonRefused(400, header, f"given {len(values)} times; give it once")
    if len(values[0]) > limit:
        raise PersonRefused(400, header, f"longer than {limit} characters")
    return values[0].strip()
