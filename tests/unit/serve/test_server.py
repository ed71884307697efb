"""serve/server.py: the addresses `serve` prints for a browser."""

from __future__ import annotations

import ipaddress

from localserve.serve.server import browser_addresses


def test_a_bound_address_is_the_one_to_open():
    assert browser_addresses("127.0.0.1") == ["127.0.0.1"]
    assert browser_addresses("192.168.1.20") == ["192.168.1.20"]
    assert browser_addresses("::1") == ["[::1]"]


def test_a_wildcard_bind_names_this_machine_then_its_networks_once_each():
    shown = browser_addresses("0.0.0.0")
    assert shown[0] == "127.0.0.1"
    assert len(set(shown)) == len(shown)
    for address in shown[1:]:  # the networks a phone is on, never another loopback or 0.0.0.0
        ip = ipaddress.ip_address(address)
        assert not ip.is_loopback and not ip.is_unspecified
