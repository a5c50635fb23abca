"""Adapters for frameworks that run jobs: Celery (kombu) and Django-Q."""
import datetime as dt
from typing import Dict, Mapping

# The enqueue options a message can carry (a Celery/kombu header, a key of a Django-Q task's
# package), and the enqueue_job argument each becomes. Passed by name and only when present, so
# a message without them makes the call a 0.2.0 database knows.
MESSAGE_OPTIONS = (
    ("jobcap_concurrency_key", "concurrency_key"),
    ("jobcap_dedupe_key", "dedupe_key"),
    ("jobcap_dedupe_window", "dedupe_window"),  # seconds
    ("jobcap_dedupe", "dedupe"),                # 'keep' (the default) or 'replace'
)


def message_options(fields: Mapping, where: str) -> Dict[str, object]:
    """The enqueue_job arguments named in fields, by argument name (for jobcap.sql._named),
    checked before anything is enqueued: the keys and the mode strings, the window a number of
    seconds (a JSON header cannot carry a timedelta). The server judges the values (a window not
    positive, a mode other than keep or replace, a mode without a key: 22023). where names the
    fields in errors ("header", "task's")."""
    out = {}
    for name, argument in MESSAGE_OPTIONS:
        value = fields.get(name)
        if value is None:
            continue
        if argument == "dedupe_window":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"jobcap: the {where} {name} must be a number of seconds, "
                                 f"not {type(value).__name__}")
            value = dt.timedelta(seconds=value)
        elif not isinstance(value, str):
            raise ValueError(f"jobcap: the {where} {name} must be a string, "
                             f"not {type(value).__name__}")
        out[argument] = value
    return out
