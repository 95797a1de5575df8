"""kiln.config: a kiln model description from a Hugging Face config.

One implementation, in C: import_hf runs `kilnc import hf` (tools/hfcmd.c,
docs/cli.md "kilnc import hf") and returns the YAML it writes; check and
compile run `kilnc check` and `kilnc compile`. Standard library only.

kilnc is found, in order: the path in KILN_KILNC; the copy installed beside
this package (kiln/_native/kilnc, by `pip install ./python`); the install
prefix's bin (by `cmake --install`, recorded in kiln/_install.py); PATH.
A failing kilnc raises KilncError with kilnc's own message.
"""

import json
import os
import shutil
import subprocess
import tempfile
import warnings

__all__ = ["KilncError", "ImportNote", "find_kilnc", "import_hf", "check", "compile", "kilnc"]

_HERE = os.path.dirname(os.path.abspath(__file__))


class KilncError(Exception):
    """kilnc failed: .returncode (1 bad input, 2 usage), .stderr its
    messages (the exception's text), .args_run the command line."""

    def __init__(self, argv, returncode, stderr):
        self.args_run = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        msg = stderr.strip() or "kilnc exited with status %d" % returncode
        super().__init__(msg)


class ImportNote(UserWarning):
    """A note `kilnc import hf` printed: what the description leaves out."""


def _installed_kilnc():
    try:
        from . import _install
    except ImportError:
        return None
    path = getattr(_install, "KILNC", None)
    if not path:
        return None
    return os.path.normpath(os.path.join(_HERE, path))


def find_kilnc():
    """The kilnc to run (see the module's docstring); FileNotFoundError
    saying where it looked when there is none."""
    env = os.environ.get("KILN_KILNC")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise FileNotFoundError("KILN_KILNC=%s is not an executable file" % env)
        return env
    looked = []
    for cand in (os.path.join(_HERE, "_native", "kilnc"), _installed_kilnc()):
        if cand is None:
            continue
        looked.append(cand)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("kilnc")
    if found:
        return found
    raise FileNotFoundError(
        "kiln: kilnc not found (looked at %s and on PATH); set KILN_KILNC to its path, "
        "e.g. build/kilnc" % (", ".join(looked) or "KILN_KILNC"))


def _path(v, what):
    """A path argument as kilnc must see it: str or os.PathLike (bytes
    decoded with os.fsdecode), never read as an option (a relative path
    starting with '-' gets './'; kilnc has no '--' separator)."""
    if not isinstance(v, (str, bytes, os.PathLike)):
        raise TypeError("%s must be a path (str or os.PathLike), not %s" % (
            what, type(v).__name__))
    p = os.fsdecode(os.fspath(v))
    if p == "":
        raise ValueError("%s is an empty path" % what)
    if "\0" in p:
        raise ValueError("%s: embedded null byte" % what)
    if p.startswith("-"):
        p = "./" + p
    return p


def _arg(a, i):
    if isinstance(a, os.PathLike):
        return _path(a, "kilnc argument %d" % i)
    if isinstance(a, (bytes, bytearray)):
        a = os.fsdecode(bytes(a))
    elif isinstance(a, bool) or not isinstance(a, (str, int, float)):
        raise TypeError("kilnc argument %d must be str, bytes, os.PathLike, int or float, "
                        "not %s" % (i, type(a).__name__))
    a = str(a)
    if "\0" in a:
        raise ValueError("kilnc argument %d: embedded null byte" % i)
    return a


def kilnc(*args, check_status=True, timeout=None):
    """Runs kilnc with args; returns its CompletedProcess (text). Arguments
    are str, bytes (os.fsdecode), os.PathLike (a path: one starting with '-'
    is passed as './-...'), int or float; anything else is a TypeError. With
    check_status, a non-zero exit raises KilncError with its stderr."""
    argv = [find_kilnc(), *[_arg(a, i) for i, a in enumerate(args)]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check_status and r.returncode != 0:
        raise KilncError(argv, r.returncode, r.stderr)
    return r


_OPTIONS = (("tp", "--tp"), ("pp", "--pp"), ("ep", "--ep"), ("vpp", "--vpp"),
            ("micro_batch", "--micro-batch"), ("global_batch", "--global-batch"),
            ("seq_len", "--seq-len"), ("hardware", "--hardware"), ("name", "--name"))


def import_hf(config, devices, tp=None, pp=None, ep=None, vpp=None, micro_batch=None,
              global_batch=None, seq_len=None, hardware=None, name=None, output=None):
    """A kiln model description (YAML text) for a Hugging Face config.

    config: the path of a config.json, or the config itself as a dict (a
    transformers PretrainedConfig's .to_dict()); a dict's model is named
    after its _name_or_path, else name=, else "model". devices and the options
    are kilnc import hf's (docs/cli.md); None leaves kilnc's default.
    output: a path to write the description to as well (kilnc's -o, under
    its output rule). Notes kilnc prints (what the description leaves out)
    are issued as ImportNote warnings. A config kilnc refuses raises
    KilncError with its messages."""
    opts = {"tp": tp, "pp": pp, "ep": ep, "vpp": vpp, "micro_batch": micro_batch,
            "global_batch": global_batch, "seq_len": seq_len, "hardware": hardware,
            "name": name}
    argv = []
    argv += ["--devices", _count(devices, "devices")]
    for key, flag in _OPTIONS:
        v = opts[key]
        if v is None:
            continue
        if key in ("hardware", "name"):
            argv += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
        else:
            argv += [flag, _count(v, key)]
    if not isinstance(config, dict):
        _path(config, "config")
    if output is not None:
        _path(output, "output")
    tmp = None
    try:
        if isinstance(config, dict):
            tmp = tempfile.TemporaryDirectory(prefix="kiln-hf-")
            # Not "config.json": kilnc would name the model after the
            # temporary directory. Without _name_or_path or name=, "model".
            path = os.path.join(tmp.name, "model.json")
            with open(path, "w") as f:
                json.dump(config, f)
        else:
            path = _path(config, "config")
        if output is not None:
            argv += ["-o", _path(output, "output")]
        r = kilnc("import", "hf", path, *argv)
    finally:
        if tmp is not None:
            tmp.cleanup()
    for line in r.stderr.splitlines():
        if line.strip():
            warnings.warn(line, ImportNote, stacklevel=2)
    if output is not None:
        with open(output) as f:
            return f.read()
    return r.stdout


def _count(v, what):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s must be an int, not %s" % (what, type(v).__name__))
    return str(v)


def check(model):
    """Runs `kilnc check` on a model description file; KilncError with its
    positioned errors when the description is invalid. model: str or
    os.PathLike (TypeError otherwise); one starting with '-' is a file."""
    kilnc("check", _path(model, "model"))


def compile(model, output, *options):
    """Runs `kilnc compile MODEL -o OUTPUT [options...]`: the plan blob
    kiln.runtime.Runtime opens. Returns output. model and output: str or
    os.PathLike (TypeError otherwise, None included); a path starting with
    '-' is a file, never an option."""
    kilnc("compile", _path(model, "model"), "-o", _path(output, "output"), *options)
    return output
