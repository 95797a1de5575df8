"""Shared fixtures: the build (KILN_BUILD, set by `make test-python`), its
kilnc, and plan blobs compiled once per session from shipped models."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# kiln.config runs the build's kilnc unless told otherwise (`make
# test-python` sets KILN_KILNC too; a bare pytest run needs only KILN_BUILD).
if os.environ.get("KILN_BUILD"):
    os.environ.setdefault("KILN_KILNC", os.path.join(os.environ["KILN_BUILD"], "kilnc"))


def build_dir():
    return os.environ["KILN_BUILD"]


def kilnc_path():
    return os.environ.get("KILN_KILNC") or os.path.join(build_dir(), "kilnc")


def kilnc(*args, **kw):
    """Runs the build's kilnc; returns the CompletedProcess (text)."""
    return subprocess.run([kilnc_path(), *args], capture_output=True, text=True, **kw)


@pytest.fixture(scope="session")
def tiny_blob(tmp_path_factory):
    """examples/models/tiny.yaml compiled: 2 stages, layer 0 dense, 1-7 MoE."""
    out = str(tmp_path_factory.mktemp("blob") / "tiny.kiln")
    r = kilnc("compile", os.path.join(ROOT, "examples", "models", "tiny.yaml"), "-o", out)
    assert r.returncode == 0, r.stderr
    return out
