"""The monitor's widgets: each one shows one part of a Snapshot (and the recent history), grouped
by what they show:

- `style.py`: a colour per user and the separator every widget draws with.
- `header.py`: the header (model, state, devices, problems) and the diagnosis line.
- `cells.py`: the KV cells' bar and the numbers behind it.
- `speed.py`: the latency and throughput panels and what each step carries.
- `requests.py`: the running and the waiting requests' tables.
- `counters.py`: the counters since start.
- `today.py`: today's totals per user.
"""
