"""Every struct kiln.runtime mirrors with ctypes has the C header's layout:
its size, and each field's offset and size, as printed by the C compiler
(python/tests/layout.c, built as build/kiln_py_layout), equal ctypes'."""

import ctypes
import os
import subprocess

from kiln import runtime


def c_layout():
    exe = os.path.join(os.environ["KILN_BUILD"], "kiln_py_layout")
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    sizes, fields = {}, {}
    for line in out.splitlines():
        parts = line.split()
        if parts[1] == "sizeof":
            sizes[parts[0]] = int(parts[2])
        else:
            fields.setdefault(parts[0], []).append((parts[1], int(parts[2]), int(parts[3])))
    return sizes, fields


def test_every_mirror_matches_the_header():
    sizes, fields = c_layout()
    assert set(sizes) == set(runtime.STRUCTS), "layout.c and runtime.STRUCTS list other structs"
    for name, mirror in runtime.STRUCTS.items():
        assert ctypes.sizeof(mirror) == sizes[name], name
        py = [(f, getattr(mirror, f).offset, getattr(mirror, f).size) for f, _ in mirror._fields_]
        assert py == fields[name], name


def test_every_struct_of_the_header_is_mirrored():
    """A struct added to runtime.h is added to kiln.runtime (and layout.c) too."""
    import re
    from conftest import ROOT
    with open(os.path.join(ROOT, "include", "kiln", "runtime.h")) as f:
        declared = set(re.findall(r"typedef struct (\w+) \{", f.read()))
    assert declared == set(runtime.STRUCTS)
