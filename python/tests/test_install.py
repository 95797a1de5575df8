"""Both installs of the package work with nothing set but the Python path:
`cmake --install BUILD --prefix P` (the package in P's Python path, finding
P's libkiln_rt and kilnc) and `pip install --no-build-isolation ./python`
(into a --target directory, carrying copies of both). Each runs a fresh
interpreter outside the source tree, with no KILN_* variable and no kilnc on
PATH, that opens a plan, selects, and imports a Hugging Face config."""

import json
import os
import shutil
import subprocess
import sys

from conftest import ROOT, build_dir

PROBE = r"""
import json, sys
import kiln, kiln.config, kiln.runtime
from kiln.runtime import Runtime
with Runtime(sys.argv[1]) as rt:
    p = rt.select(0, 1, [300, 200, 100, 40], 3 << 20)
text = kiln.config.import_hf(sys.argv[2], devices=64, tp=2, pp=4)
print(json.dumps({"package": kiln.__file__, "library": kiln.runtime.library_path(),
                  "kilnc": kiln.config.find_kilnc(), "plan": p.plan,
                  "yaml": text.startswith("# Imported")}))
"""


def clean_env(pythonpath):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = pythonpath
    env["PATH"] = "/usr/bin:/bin"
    return env


def probe(tmp_path, pythonpath, blob):
    r = subprocess.run([sys.executable, "-c", PROBE, blob,
                        os.path.join(ROOT, "examples", "hf", "mixtral-8x22b.json")],
                       capture_output=True, text=True, cwd=str(tmp_path),
                       env=clean_env(pythonpath))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def expected_plan(blob):
    from kiln.runtime import Runtime
    with Runtime(blob) as rt:
        return rt.select(0, 1, [300, 200, 100, 40], 3 << 20).plan


def inside(path, root):
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def test_cmake_install(tmp_path, tiny_blob):
    prefix = tmp_path / "prefix"
    cmake = shutil.which("cmake") or "/usr/bin/cmake"
    r = subprocess.run([cmake, "--install", build_dir(), "--prefix", str(prefix)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    inits = [os.path.join(d, "__init__.py") for d, _, files in os.walk(prefix)
             if os.path.basename(d) == "kiln" and "__init__.py" in files]
    assert len(inits) == 1, inits
    site = os.path.dirname(os.path.dirname(inits[0]))
    # P's Python path: where this interpreter reads packages under a prefix.
    v = "%d.%d" % sys.version_info[:2]
    assert os.path.relpath(site, prefix) in ("lib/python%s/dist-packages" % v,
                                             "lib/python%s/site-packages" % v)
    got = probe(tmp_path, site, tiny_blob)
    assert inside(got["package"], site)
    assert inside(got["library"], prefix) and "libkiln_rt.so" in got["library"]
    assert os.path.samefile(got["kilnc"], prefix / "bin" / "kilnc")
    assert got["plan"] == expected_plan(tiny_blob)
    assert got["yaml"]


def test_pip_install(tmp_path, tiny_blob):
    # From a copy of python/: pip builds in the source directory.
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    env = dict(os.environ, KILN_BUILD=build_dir())
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-index", "--no-deps", "--target", str(target), str(src)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    got = probe(tmp_path, str(target), tiny_blob)
    assert inside(got["package"], target)
    assert os.path.realpath(got["library"]) == \
        os.path.realpath(target / "kiln" / "_native" / "libkiln_rt.so.0")
    assert os.path.samefile(got["kilnc"], target / "kiln" / "_native" / "kilnc")
    assert got["plan"] == expected_plan(tiny_blob)
    assert got["yaml"]


def test_pip_install_without_a_build_says_so(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = dict(os.environ, KILN_BUILD=str(tmp_path / "no-build"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-index", "--no-deps", "--target", str(tmp_path / "site"), str(src)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode != 0
    assert "build kiln first (`make build`), or set KILN_BUILD" in r.stdout + r.stderr


def test_version_is_the_projects():
    import kiln
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        head = f.read(2000)
    assert "project(kiln VERSION %s " % kiln.__version__ in head
