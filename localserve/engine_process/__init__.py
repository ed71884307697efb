"""The engine in a process of its own, watched: llama.cpp may abort or hang; the server stays up.

llama.cpp ends its process when something goes badly wrong inside it (SIGABRT: an RPC worker
that died, an assertion), and waits forever for an RPC worker that stopped answering. So `serve`
runs the engine (the runner, the scheduler, the metrics: all of localserve.engine.engine) in a
child process, and the server's process keeps what users see: connections, the queue's bounds,
the usage record, the monitor. The package by side of the process boundary:

- `parent.py`: the server's side. `EngineProcess` implements `localserve.engine.client.EngineClient`
  (what `Server` uses of an engine); `Vocabulary` has what the server uses of the runner
  (`tokenize`, `apply_chat_template`, `info`, `where`): prompts are tokenized there, with a
  vocabulary-only load of the model, and only token ids cross. Its watchdog thread lives there.
- `watchdog.py`: the watchdog's verdict on each look, a pure function, and exit codes in words.
- `messages.py`: what crosses the pipe (the engine's own commands go as they are).
- `step_clock.py`: the shared memory where the engine says when its running step started.
- `child.py`: the engine process's main (`python -m localserve.engine_process.child`).

    server process                                  engine process (spawned)
    Server -> EngineProcess --- Pipe, msgpack ---> child -> Engine (its own thread) -> llama.cpp
              ^ watchdog (step clock, exit) <--- events, snapshots --'

The watchdog: the engine thread writes when each step starts into the step clock; a step that
runs past `step_timeout_s` (or a load past `load_timeout_s`) gets the process killed. Whether it
died or was killed, every request in flight gets its `done` with `finish_reason = "error"`
(code `unavailable`), new chats are refused with `unavailable`, the snapshot says why
(`engine_problem`, and each worker's state), and a new process loads the model again as soon as
every RPC worker answers llama.cpp's hello (`rpc.probe`, in Python: it cannot abort us).
"""
