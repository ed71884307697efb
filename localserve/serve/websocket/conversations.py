"""A connection's conversation frames: the person's conversations kept on the server.

On a server with users (and [server] conversations on) the welcome says `conversations: true`
and the page lists, opens, saves, renames and deletes its person's conversations with these
frames (docs/protocol.md, "Conversations on the server"); the store is ops/conversations.py.
Every frame acts on the connection's own user: no frame names another person. A save or rename
is answered to the connection that asked (`here: true`) and told to that person's other
connections (`here: false`), so a second browser or a phone follows. A store that cannot save
answers `not_saved` with its words; the connection goes on.

Tested in tests/e2e/test_conversation_store.py; on a fake Frontdoor in tests/unit/serve/websocket/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from localserve.ops.conversations import Conflict, ConversationStore, StoreError
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

LIST_PAGE = 100  # summaries per conversation_list frame: a long list comes in pages
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
    others: Callable[[Speaker], Iterable[Speaker]],
) -> None:
    """Do what the frame asks for the speaker's own user; `others(speaker)`: that user's other
    connections (when the store has answered), told of a save, rename or delete."""
    user = speaker.user
    assert user is not None  # hello came first (the connection checks)
    if store is None:
        return speaker.error("bad_request", NOT_KEPT, getattr(frame, "id", None))
    try:
        if isinstance(frame, ListConversations):
            found = await store.list(user)
            page = found[frame.offset : frame.offset + LIST_PAGE]
            used = sum(s.bytes for s in found)
            speaker.send(
                ConversationList(
                    page, used, store.max_bytes, store.max_count, frame.offset, len(found)
                )
            )
        elif isinstance(frame, GetConversation):
            if (got := await store.get(user, frame.id)) is None:
                return _unknown(speaker, frame.id)
            speaker.send(ConversationFound(*got))
        elif isinstance(frame, SaveConversation):
            saved = await store.save(user, frame.conversation, frame.base_revision)
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
        if isinstance(frame, ListConversations | GetConversation | DeleteConversation):
            return speaker.error("unavailable", str(e), getattr(frame, "id", None))
        target = frame.conversation.id if isinstance(frame, SaveConversation) else frame.id
        code = "conflict" if isinstance(e, Conflict) else "not_saved"
        speaker.error(code, f"not saved: {e}", target)


def _tell(speaker: Speaker, others, frame_for) -> None:
    speaker.send(frame_for(True))
    for other in others(speaker):
        other.send(frame_for(False))


def _unknown(speaker: Speaker, id: str) -> None:
    speaker.error("unknown_id", f"you have no conversation {id[:64]!r} on this server", id)
