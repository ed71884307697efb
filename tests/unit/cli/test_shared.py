"""What the commands share (localserve/cli/shared.py): the --no-prefix-cache option."""

from __future__ import annotations


def test_no_prefix_cache_turns_prefix_caching_off():
    from localserve.cli import build_parser
    from localserve.cli.shared import prefix_cache_option
    from localserve.config import Config

    config = Config()
    assert config.scheduler.prefix_caching
    off = prefix_cache_option(config, True)
    assert off.scheduler.prefix_caching is False and config.scheduler.prefix_caching
    assert prefix_cache_option(config, False) is config
    assert build_parser().parse_args(["serve", "--no-prefix-cache"]).no_prefix_cache
    assert not build_parser().parse_args(["serve"]).no_prefix_cache
