"""Tasks for the Django-Q cluster test, and a probe of its status."""
import time


def ok(x):
    return x * 2


def boom(what, *more, **options):
    raise ValueError(f"cannot process {what}")


def hang(seconds):
    time.sleep(seconds)


def cluster_stats():
    """What qinfo and qmonitor read (Stat.get_all), as JSON: [[status, workers, id hex]]."""
    import json
    from django_q.status import Stat
    return json.dumps([[str(s.status), len(s.workers), s.cluster_id.hex] for s in Stat.get_all()])
