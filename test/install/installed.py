"""Shared by the check_*.py files of test/install: the Python client as an application gets it.

build_wheel() builds the wheel once per test process from a copy of clients/python (pip builds
in the source tree; the copy keeps the checkout clean, and it may be read-only), offline:
`pip wheel --no-build-isolation --no-index --no-deps` with Debian's python3-setuptools and
python3-wheel. make_venv() makes a virtualenv outside the repository with Debian's packages
visible (--system-site-packages: Debian 12's python3 is externally managed, and celery, kombu,
django, django-q and psycopg come from Debian) and installs that wheel into it. app_env() is
the environment an application runs in: no PYTHONPATH and no path into the checkout.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PYTHON_CLIENT = os.path.join(ROOT, "clients", "python")
sys.path.insert(0, os.path.join(PYTHON_CLIENT, "tests"))
from pgserver import Server  # noqa: E402,F401  (the test's own server, not the application's)

_wheel = None


def run(cmd, cwd, env=None, timeout=600):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}"
                             f"{result.stderr}")
    return result.stdout


def app_env(**extra) -> dict:
    """The environment of an application: this one's less anything that points at Python
    code (PYTHONPATH, PYTHONHOME, PYTHONSTARTUP) or into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTHON") and ROOT not in v}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                  if p and not p.startswith(ROOT))
    env.update(extra)
    return env


def build_wheel() -> str:
    """The wheel of clients/python, built once per process; returns its path."""
    global _wheel
    if _wheel is None:
        work = tempfile.mkdtemp(prefix="jobcap-wheel-")
        source = os.path.join(work, "src")
        shutil.copytree(PYTHON_CLIENT, source,
                        ignore=shutil.ignore_patterns("build", "dist", "*.egg-info",
                                                      "__pycache__"))
        dist = os.path.join(work, "dist")
        run([sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel",
             "--no-build-isolation", "--no-index", "--no-deps", "-w", dist, source], work,
            env=app_env())
        wheels = [w for w in os.listdir(dist) if w.endswith(".whl")]
        if len(wheels) != 1:
            raise AssertionError(f"expected one wheel, got {wheels}")
        _wheel = os.path.join(dist, wheels[0])
    return _wheel


def make_venv(where: str, wheel: str) -> str:
    """A virtualenv at where with the wheel installed; returns its python."""
    run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", where], os.path.dirname(where),
        env=app_env())
    python = os.path.join(where, "bin", "python")
    run([python, "-m", "pip", "--disable-pip-version-check", "--no-cache-dir", "install",
         "--no-index", "--no-deps", wheel], os.path.dirname(where), env=app_env())
    return python


def source_files() -> set:
    """Every file of the package in the checkout (what the wheel must hold), as wheel paths."""
    files = set()
    top = os.path.join(PYTHON_CLIENT, "jobcap")
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(dirpath, name)
            files.add(os.path.relpath(path, PYTHON_CLIENT).replace(os.sep, "/"))
    return files
