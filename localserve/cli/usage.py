"""`localserve usage`: who used how much of which model, per user and day, with each model's
total, from the server's usage record."""

from __future__ import annotations

import argparse
import json
import time

from localserve.cli.shared import team_options
from localserve.config import load_config


def add(sub) -> None:
    u = sub.add_parser(
        "usage",
        help="who used how much: per user, model and day, from the usage record",
        description="Read the usage record in the state directory: requests, prompt tokens "
        "(and how many were reused from the cache) and tokens out, per user, model and day, "
        "then each model's total over the period, with each user's daily quota.",
    )
    u.add_argument("--since", default="today", help="today (default), 7d, 24h or 2026-11-01")
    u.add_argument("--user", help="only this user")
    u.add_argument("--json", action="store_true", help="JSON lines, one per day, user and model")
    u.add_argument("--state-dir", help="where the database is (default [server] state_dir)")
    u.add_argument("--users", help="the server's users file (for its [daily_tokens] quotas)")
    u.set_defaults(run=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    from localserve.ops import usage, usage_database, usage_report
    from localserve.ops.auth import load_daily_tokens

    config = load_config(args.config)
    server = team_options(config.server, args, load_daily_tokens(args.users))
    since = usage_report.parse_since(args.since, time.time())
    db = usage_database.connect(usage.state_dir(server) / usage_database.DATABASE, readonly=True)
    try:
        days = usage_report.by_day(db, since, args.user)
        models = usage_report.by_model(db, since, args.user)
    finally:
        db.close()
    if args.json:
        for day in days:
            print(json.dumps(usage_report.day_dict(day), ensure_ascii=False))
    else:
        print(usage_report.table(days, server, models))
    return 0
