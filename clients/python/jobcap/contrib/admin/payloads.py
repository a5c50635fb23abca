"""What a job's payload is, for the admin page: the task's name and an excerpt of its arguments.

Nothing here runs code from a payload. Two kinds are decoded:

* Django-Q's package (``{"package": "..."}``, jobcap.contrib.django_q) is a pickle signed by
  django_q.signing with SECRET_KEY and the cluster's name as salt (the jobcap queue's name).
  The signature is checked first (HMAC; nothing is decompressed or parsed before that), and the
  pickle is then read by an unpickler that imports nothing: every class or function it names
  becomes an inert stand-in that keeps what the pickle gives it and shows its name (a Django
  model instance shows as <app.Model pk>), and a few value types (dates, times, decimals) are
  built as themselves. A package that does not verify is shown as such, not decoded.
* A kombu message (``{"body": ..., "headers": ...}``, jobcap.contrib.kombu) names its Celery
  task in its headers, with Celery's own ``argsrepr``/``kwargsrepr`` (which an application may
  have set to hide arguments: they are preferred to the body). Without them a JSON body
  (kombu's default serializer) is decoded; a body in any other serialization (pickle, yaml,
  msgpack) is not.

Anything else is shown as its JSON text, cut to the excerpt's length.
"""
from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import io
import json
import pickle
import reprlib
import uuid
from typing import Optional

EXCERPT = 160
MAX_PACKAGE = 1 << 20      # larger packages are not decoded for display

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxlevel = 3

class _StandIn:
    """An object of a class the page does not import: it keeps what the pickle gave it."""

    _name = "?"

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj._args = args
        obj._state = None
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self._state = state

    def __repr__(self):
        if self._name == "django.db.models.base.model_unpickle" and self._args:
            model = self._args[0]     # a Django model instance: (app_label, model_name)
            pk = self._state.get("id", self._state.get("pk")) if isinstance(
                self._state, dict) else None
            label = ".".join(model) if isinstance(model, tuple) else _repr.repr(model)
            return f"<{label} {pk!r}>" if pk is not None else f"<{label}>"
        if self._name == "uuid.UUID" and isinstance(self._state, dict) and isinstance(
                self._state.get("int"), int):
            return repr(uuid.UUID(int=self._state["int"]))
        if self._args:
            return f"{self._name}({', '.join(_repr.repr(a) for a in self._args)})"
        if isinstance(self._state, dict):
            pk = self._state.get("id", self._state.get("pk"))
            if pk is not None:
                return f"<{self._name} {pk!r}>"
        return f"<{self._name}>"


def _stand_in(module: str, name: str) -> type:
    return type(name, (_StandIn,), {"_name": f"{module}.{name}"})


def _value(module: str, name: str, make) -> type:
    """A value type built as itself (its constructor only makes a value), or as a stand-in
    when its arguments are stand-ins (a datetime whose tzinfo is of an unknown class)."""

    def __new__(cls, *args, **kwargs):
        try:
            return make(*args)      # not an instance of cls: __init__ is not called
        except Exception:
            return _StandIn.__new__(cls, *args)
    return type(name, (_StandIn,), {"_name": f"{module}.{name}", "__new__": __new__})


_VALUES = {(m, n): _value(m, n, make) for m, n, make in (
    ("datetime", "datetime", datetime.datetime), ("datetime", "date", datetime.date),
    ("datetime", "time", datetime.time), ("datetime", "timedelta", datetime.timedelta),
    ("datetime", "timezone", datetime.timezone), ("decimal", "Decimal", decimal.Decimal),
    ("pytz", "_UTC", lambda: datetime.timezone.utc),        # Django 3.2's timezone.utc
)}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        known = _VALUES.get((module, name))
        return known if known is not None else _stand_in(module, name)

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not read")


class _InertSerializer:
    @staticmethod
    def loads(data: bytes):
        return _Unpickler(io.BytesIO(data)).load()


def _label(func) -> str:
    if isinstance(func, str):
        return func
    if isinstance(func, type) and issubclass(func, _StandIn):
        return func._name
    return repr(func)


def _call(args, kwargs) -> str:
    parts = [_repr.repr(a) for a in (args or ())]
    if isinstance(kwargs, dict):
        parts += [f"{k}={_repr.repr(v)}" for k, v in kwargs.items()]
    return _cut("(" + ", ".join(parts) + ")")


def _cut(text: str, limit: int = EXCERPT) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def django_q_task(package: str, salts) -> Optional[dict]:
    """Django-Q's task dict from a signed package, read inertly; None when no salt verifies."""
    from django_q import core_signing as signing
    from django_q.conf import Conf
    if not isinstance(package, str) or len(package) > MAX_PACKAGE:
        return None
    for salt in dict.fromkeys(s for s in salts if s):
        try:
            task = signing.loads(package, key=Conf.SECRET_KEY, salt=salt,
                                 serializer=_InertSerializer)
        except signing.BadSignature:
            continue
        except Exception:   # verified, but not a pickle this reader can follow
            return {"undecodable": True}
        return task if isinstance(task, dict) else {"undecodable": True}
    return None


def describe(payload, queue: str = "") -> dict:
    """{"kind", "task", "args", "note"} for a job's payload (see the module's documentation):
    a decoded jsonb, or its text (Django's PostgreSQL backend does not decode jsonb)."""
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            return {"kind": "json", "task": "", "args": _cut(payload), "note": ""}
    if isinstance(payload, dict) and set(payload) == {"package"}:
        return _django_q(payload["package"], queue)
    if isinstance(payload, dict) and "body" in payload and isinstance(payload.get("headers"),
                                                                       dict):
        return _kombu(payload)
    return {"kind": "json", "task": "", "args": _cut(json.dumps(payload, ensure_ascii=False)),
            "note": ""}


def _django_q(package, queue: str) -> dict:
    try:
        from django_q.conf import Conf
    except ImportError:
        return {"kind": "django-q", "task": "", "args": "",
                "note": "Django-Q package (django_q is not installed here)"}
    task = django_q_task(package, (queue, Conf.PREFIX))
    if task is None:
        return {"kind": "django-q", "task": "", "args": "",
                "note": "Django-Q package whose signature does not verify with this site's "
                        "SECRET_KEY and the queue's name: not decoded"}
    if task.get("undecodable"):
        return {"kind": "django-q", "task": "", "args": "",
                "note": "Django-Q package (signed) that this page cannot read"}
    name = task.get("name") or ""
    note = f"Django-Q task {name}" if name else "Django-Q task"
    if task.get("group"):
        note += f", group {task['group']}"
    return {"kind": "django-q", "task": _label(task.get("func")),
            "args": _call(task.get("args"), task.get("kwargs")), "note": note}


def _kombu(message: dict) -> dict:
    headers = message["headers"]
    props = message.get("properties") if isinstance(message.get("properties"), dict) else {}
    ctype = message.get("content-type") or ""
    task = headers.get("task")
    if task and ("argsrepr" in headers or "kwargsrepr" in headers):
        args = str(headers.get("argsrepr") or "()")
        kwargs = str(headers.get("kwargsrepr") or "{}")
        shown = args if kwargs in ("{}", "") else f"{args} {kwargs}"
        return {"kind": "celery", "task": str(task), "args": _cut(shown),
                "note": "Celery task (arguments as Celery's argsrepr/kwargsrepr)"}
    body = _json_body(message.get("body"), props.get("body_encoding"), ctype)
    if body is _NOT_JSON:
        return {"kind": "celery" if task else "kombu", "task": str(task or ""), "args": "",
                "note": f"kombu message, body in {ctype or 'an unknown serialization'}: "
                        "not decoded"}
    if task and isinstance(body, list) and len(body) >= 2:        # Celery's protocol 2
        return {"kind": "celery", "task": str(task), "args": _call(body[0], body[1]),
                "note": "Celery task"}
    if isinstance(body, dict) and "task" in body:                  # Celery's protocol 1
        return {"kind": "celery", "task": str(body["task"]),
                "args": _call(body.get("args"), body.get("kwargs")), "note": "Celery task"}
    return {"kind": "kombu", "task": str(task or ""),
            "args": _cut(json.dumps(body, ensure_ascii=False)), "note": "kombu message"}


_NOT_JSON = object()


def _json_body(body, encoding, ctype):
    if ctype != "application/json" or not isinstance(body, str) or len(body) > MAX_PACKAGE:
        return _NOT_JSON
    try:
        raw = base64.b64decode(body, validate=True) if encoding == "base64" else body
        return json.loads(raw)
    except (binascii.Error, ValueError):
        return _NOT_JSON
