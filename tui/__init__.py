"""The terminal UI: the Textual monitor, its plain-words diagnosis, and the terminal chat client.
It speaks only localserve's protocol, through localserve.websocket_client; the `demo`,
`monitor` and `chat` commands (localserve/cli/) open it.

- `monitor.py`: `localserve monitor`: what the scheduler is doing, live, and why it is slow
  (styled by monitor.tcss).
- `widgets/`: the monitor's widgets, each showing one part of a snapshot.
- `source.py`: where the monitor's numbers come from: the stats stream, or anything that
  yields.
- `diagnosis/`: what an operator would conclude from the recent stats, in plain words.
- `format.py`: how the monitor and the diagnosis write numbers.
- `chat.py`: `localserve chat`: a plain terminal chat client.
- `model_picker.py`: the terminal chat's `/model` command.
- `server_chats.py`: the terminal chat's conversations kept on the server.
- `waiting.py`: the terminal chat's line while a reply waits: its place and predicted wait.
"""
