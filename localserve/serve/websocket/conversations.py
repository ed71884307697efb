"""A connection's conversation frames: the person's conversations kept on the server.

On a server with users (and [server] conversations on) the welcome says `conversations: true`
and the page lists, opens, saves, renames and deletes its person's conversations with these
frames (docs/protocol.md, "Conversations on the server"); the store is ops/conversations.py.
Every frame acts on the connection's own user: no frame names another person. A save or rename
is answered to the connection that asked (`here: true`) and told to that person's other
connections (`here: false`), so a second browser or a phone follows. A store that cannot save
answers `not_saved` with its words; the connection goes on.

Tested in tests/e2e/test_conversation_store.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from localserve.ops.conversations import ConversationStore, StoreError
from localserve.protocol.frames import (
    ConversationDeleted,
    ConversationFound,
    ConversationList,
    ConversationSaved,
    DeleteConversation,
    GetConversation,
    ListConversations,
    RenameConversation,
    SaveConversation,
)

NOT_KEPT = (
    "this server keeps no conversations (it has no users, or [server] conversations = false): "
    "they stay in the browser"
)


class Speaker(Protocol):
    """What these frames need of a connection (websocket/connection.py's `Connection`)."""

    user: str | None

    def send(self, frame) -> None: ...
    def error(self, code: str, message: str, client_id: str | None = None) -> None: ...


async def answer(
    speaker: Speaker,
    frame,
    store: ConversationStore | None,
    others: Iterable[Speaker],
) -> None:
    """Do what the frame asks for the speaker's own user; `others`: that user's other
    connections, told of a save, rename or delete."""
    user = speaker.user
    assert user is not None  # hello came first (the connection checks)
    if store is None:
        return speaker.error("bad_request", NOT_KEPT, getattr(frame, "id", None))
    try:
        if isinstance(frame, ListConversations):
            found = await store.list(user)
            _count, used = await store.used(user)
            speaker.send(ConversationList(found, used, store.max_bytes, store.max_count))
        elif isinstance(frame, GetConversation):
            if (got := await store.get(user, frame.id)) is None:
                return _unknown(speaker, frame.id)
            speaker.send(ConversationFound(*got))
        elif isinstance(frame, SaveConversation):
            saved = await store.save(user, frame.conversation)
            _tell(speaker, others, lambda here: ConversationSaved(saved, here))
        elif isinstance(frame, RenameConversation):
            if (renamed := await store.rename(user, frame.id, frame.title)) is None:
                return _unknown(speaker, frame.id)
            _tell(speaker, others, lambda here: ConversationSaved(renamed, here))
        elif isinstance(frame, DeleteConversation):
            if not await store.delete(user, frame.id):
                return _unknown(speaker, frame.id)
            _tell(speaker, others, lambda here: ConversationDeleted(frame.id, here))
    except StoreError as e:
        if isinstance(frame, (ListConversations, GetConversation)):
            return speaker.error("unavailable", str(e), getattr(frame, "id", None))
        target = frame.conversation.id if isinstance(frame, SaveConversation) else frame.id
        speaker.error("not_saved", f"not saved: {e}", target)


def _tell(speaker: Speaker, others: Iterable[Speaker], frame_for) -> None:
    speaker.send(frame_for(True))
    for other in others:
        other.send(frame_for(False))


def _unknown(speaker: Speaker, id: str) -> None:
    speaker.error("unknown_id", f"you have no conversation {id[:64]!r} on this server", id)
