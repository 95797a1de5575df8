"""The shared runtime library the Python package loads (KILN_RT_LIBRARY, set
by `make test-python`) is the one the header describes: every error code of
include/kiln/runtime.h's KILN_RT_ERRORS table has the text the header gives
it, read from the header itself."""

import ctypes
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def header_errors():
    with open(os.path.join(ROOT, "include", "kiln", "runtime.h")) as f:
        text = f.read()
    rows = re.findall(r'X\((\w+), (-?\d+), "([^"]*)"\)', text)
    assert len(rows) >= 10, "the KILN_RT_ERRORS table was not found"
    return [(name, int(code), msg) for name, code, msg in rows]


def test_strerror_matches_the_header():
    lib = ctypes.CDLL(os.environ["KILN_RT_LIBRARY"])
    lib.kiln_rt_strerror.restype = ctypes.c_char_p
    lib.kiln_rt_strerror.argtypes = [ctypes.c_int]
    for name, code, msg in header_errors():
        assert lib.kiln_rt_strerror(code).decode() == msg, name


def test_action_names_are_the_runtimes():
    """kiln.runtime.ACTIONS, the package's names, are the runtime's one C
    table (kiln_rt_action_name), indexed by kiln_rt_action; "?" outside it."""
    from kiln import runtime

    lib = ctypes.CDLL(os.environ["KILN_RT_LIBRARY"])
    lib.kiln_rt_action_name.restype = ctypes.c_char_p
    lib.kiln_rt_action_name.argtypes = [ctypes.c_int]
    for code in (runtime.KEEP, runtime.RECOMPUTE, runtime.OFFLOAD):
        assert lib.kiln_rt_action_name(code).decode() == runtime.ACTIONS[code]
    assert lib.kiln_rt_action_name(-1).decode() == "?"
    assert lib.kiln_rt_action_name(len(runtime.ACTIONS)).decode() == "?"
