"""The caps on one place's sockets (localserve/serve/transport.py): their rule, on
`ConnectionLimits` alone with a fake clock. The guarded protocols on a server (pipelining, the
caps, a squatter, malformed frames) are in e2e/test_guarded_transport.py.
"""

from __future__ import annotations

from localserve.config import ServerConfig
from localserve.serve.transport import MIN_IDLE_S, ConnectionLimits


def test_past_the_cap_a_new_socket_closes_the_longest_idle_one():
    limits, now, closed = _limits(max_connections=1)  # one place: 33 sockets
    for i in range(33):
        assert limits.open("p")
        limits.idle("p", i, lambda i=i: closed.append(i))
        now[0] += 0.01
    limits.in_use("p", 0)  # a request in progress: never closed to make room
    now[0] += MIN_IDLE_S
    assert limits.open("p") and closed == [1]
    limits.idle("p", 1, lambda: closed.append(1))  # idle again: now the newest
    assert limits.open("p") and closed == [1, 2]
    assert limits.open("elsewhere") and closed == [1, 2]  # other places are not touched
    assert limits.num_evicted == 2


def test_young_idle_sockets_are_spared_and_twice_the_cap_is_the_end():
    """A client reconnecting at once must not cycle through a place's idle sockets faster than
    a newcomer can send its request: a socket idle under MIN_IDLE_S is never closed for it."""
    limits, now, closed = _limits(max_connections=1)
    for i in range(66):
        assert limits.open("p")
        limits.idle("p", i, lambda i=i: closed.append(i))
    assert not limits.open("p") and not closed  # 66 young ones: the 67th is refused
    now[0] += MIN_IDLE_S
    assert limits.open("p") and closed == [0]  # the longest idle makes room


def test_every_place_together_is_capped_too():
    limits, now, closed = _limits(max_connections=1)  # 33 a place, 66 in all, 132 at most
    for i in range(66):
        place = f"p{i % 2}"
        assert limits.open(place)
        limits.idle(place, i, lambda i=i: closed.append(i))
    now[0] += MIN_IDLE_S
    assert limits.open("third") and closed == [0]  # the place holding the most gives way


def _limits(**config):
    limits = ConnectionLimits(lambda: ServerConfig(**config), 0)
    now = [0.0]
    limits.clock = lambda: now[0]
    return limits, now, []
