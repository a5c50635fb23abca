"""Tasks for the Django-Q cluster test."""
import time


def ok(x):
    return x * 2


def boom(what, *more, **options):
    raise ValueError(f"cannot process {what}")


def hang(seconds):
    time.sleep(seconds)
