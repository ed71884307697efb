"""The terminal UI: the Textual monitor (monitor.py, widgets/), its plain-words diagnosis
(diagnosis/), and the terminal chat client (chat.py). It speaks only localserve's protocol,
through localserve.websocket_client; the `demo`, `monitor` and `chat` commands (localserve/cli/)
open it."""
