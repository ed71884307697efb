"""The server: its lifecycle, admission (admission.py, with authentication.py, model_waits.py
and request_counts.py), the front-ends' seam (door.py; every model's door model_door.py),
prompt building, transport limits, and one subpackage per front-end (websocket/, openai/)
plus the chat page.
"""
