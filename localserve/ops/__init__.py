"""What an operator runs the server with: the usage record and quotas, users and tokens,
Prometheus metrics.

- `auth.py`: who may connect: per-user tokens, the monitor token, the bind-address rule.
- `users_file.py`: editing a users file: people added with new tokens, removed, listed.
- `monitor_token.py`: the monitor token: configured, or kept in the state directory.
- `usage.py`: who used how much: the writer of a row per finished request.
- `usage_database.py`: the usage record's SQLite file: schema, migrations, rows read back.
- `quotas.py`: the day's counts and the daily quotas: holds while a reply runs, then settled.
- `access_log.py`: the access log: one line per finished request, for the operator's tools.
- `usage_report.py`: what `localserve usage` reads from the record and prints.
- `people.py`: the people trusted front-ends named, kept in SQLite.
- `conversations.py`: each person's conversations from the chat page, kept in SQLite.
- `responses_store.py`: each person's stored responses of the Responses API, kept in SQLite.
- `sqlite_files.py`: the state directory's SQLite files, opened the one way the stores keep
  them.
- `state_dir.py`: the state directory trusted for nothing: private, no link followed, files
  told from ones put in their place.
- `prometheus.py`: `/metrics`: a Snapshot in Prometheus text format, with vLLM's names.
"""
