"""The engine in a supervised process of its own: the messages across the boundary, the
parent's client and watchdog, the child's main.
"""
