"""kiln.config runs `kilnc import hf`: every shipped Hugging Face config
(examples/hf) imports to a description `kilnc check` accepts, with the model
card's parameter count; the same config given as a dict imports to the same
text; kilnc's errors come back as KilncError with its message."""

import json
import os
import warnings

import pytest

from conftest import ROOT, kilnc
from kiln import config
from kiln.config import KilncError

# Model card totals, from each model's Hugging Face page (as examples/hf/README.md
# and tests/test_import.c list them); Kimi K2's card says 1T.
CARDS = {
    "deepseek-v3-671b": "671B", "kimi-k2-1t": "1T", "qwen3-235b-a22b": "235B",
    "mixtral-8x22b": "141B", "llama3-8b-dense": "8.03B", "gpt-oss-120b": "117B",
    "qwen2-57b-a14b": "57B",
}


def card_interval(card):
    """The interval a card's figure stands for: the larger of 0.5% and half
    a unit of its last digit ("57B": 56.5B to 57.5B)."""
    unit = 1e12 if card.endswith("T") else 1e9
    digits = card[:-1]
    v = float(digits)
    last = 10.0 ** -len(digits.split(".")[1]) if "." in digits else 1.0
    tol = max(0.5 * last * unit, 0.005 * v * unit)
    return v * unit - tol, v * unit + tol


def hf(name):
    return os.path.join(ROOT, "examples", "hf", name + ".json")


def test_every_shipped_config_is_listed():
    shipped = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "examples", "hf"))
                     if f.endswith(".json"))
    assert shipped == sorted(CARDS)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_shipped_config_imports_and_checks(name, tmp_path):
    out = tmp_path / (name + ".yaml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", config.ImportNote)
        text = config.import_hf(hf(name), devices=512, pp=4, tp=2, output=out)
    assert out.read_text() == text
    assert text.startswith("kiln: 1") or "\nkiln: 1" in text
    config.check(out)  # raises on a description check refuses
    r = kilnc("report", str(out), "--json")
    assert r.returncode == 0, r.stderr
    total = json.loads(r.stdout)["params"]["total"]
    lo, hi = card_interval(CARDS[name])
    assert lo <= total <= hi, (name, total, CARDS[name])


def test_stdout_and_dict_forms_give_the_same_description():
    path = hf("mixtral-8x22b")
    with open(path) as f:
        cfg = json.load(f)
    a = config.import_hf(path, devices=64, tp=2, pp=4, name="m")
    b = config.import_hf(cfg, devices=64, tp=2, pp=4, name="m")
    # The first line names the file imported (a temporary one for the dict).
    assert a.split("\n", 1)[1] == b.split("\n", 1)[1]
    assert "\nname: m\n" in a
    assert "\nname: model\n" in config.import_hf(cfg, devices=64, tp=2, pp=4)
    cfg["_name_or_path"] = "mistralai/Mixtral-8x22B-v0.1"
    assert "\nname: mixtral-8x22b-v0.1\n" in config.import_hf(cfg, devices=64, tp=2, pp=4)


def test_notes_become_warnings():
    with pytest.warns(config.ImportNote, match="sliding-window"):
        config.import_hf(hf("gpt-oss-120b"), devices=512, pp=4, tp=2)


def test_kilnc_errors_are_raised_with_its_message(tmp_path):
    with pytest.raises(KilncError) as e:
        config.import_hf(hf("mixtral-8x22b"), devices=8, pp=8, vpp=8)
    assert e.value.returncode == 1
    assert "layers (56) must be at least pp * vpp (8 * 8)" in str(e.value)
    with pytest.raises(KilncError) as e:
        config.import_hf(hf("mixtral-8x22b"), devices=100, pp=8)
    assert e.value.returncode == 2
    assert "--devices 100 is not a multiple of tp x pp = 1 x 8" in str(e.value)
    # A required field missing is named (docs/cli.md).
    with open(hf("qwen3-235b-a22b")) as f:
        cfg = json.load(f)
    del cfg["vocab_size"]
    with pytest.raises(KilncError, match="missing required field 'vocab_size'"):
        config.import_hf(cfg, devices=8)
    with pytest.raises(KilncError, match="cannot"):
        config.import_hf(tmp_path / "nope.json", devices=8)
    with pytest.raises(TypeError):
        config.import_hf(hf("mixtral-8x22b"), devices="8")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kiln: 1\nname: x\nmodel:\n  layers: -3\n")
    with pytest.raises(KilncError, match=r"bad.yaml:\d+:\d+: error"):
        config.check(bad)


def test_finding_kilnc(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_KILNC", str(tmp_path / "no-kilnc"))
    with pytest.raises(FileNotFoundError, match="KILN_KILNC"):
        config.find_kilnc()
    # Without the variable and nothing installed beside the package, PATH.
    monkeypatch.delenv("KILN_KILNC")
    monkeypatch.setenv("PATH", os.environ["KILN_BUILD"])
    assert os.path.samefile(config.find_kilnc(), os.path.join(os.environ["KILN_BUILD"], "kilnc"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="kilnc not found"):
        config.find_kilnc()


def test_paths_are_checked_and_never_read_as_options(tmp_path, monkeypatch):
    model = os.path.join(ROOT, "examples", "models", "tiny.yaml")
    monkeypatch.chdir(tmp_path)
    for bad in (None, 3, ["a.yaml"]):
        with pytest.raises(TypeError, match="must be a path"):
            config.check(bad)
        with pytest.raises(TypeError, match="must be a path"):
            config.compile(model, bad)
        with pytest.raises(TypeError, match="must be a path"):
            config.compile(bad, "out.kiln")
    assert not (tmp_path / "None").exists()
    # A path starting with '-' is a file: './--help' does not exist.
    with pytest.raises(KilncError, match="cannot read './--help'"):
        config.check("--help")
    with open(model) as src, open(tmp_path / "-m.yaml", "w") as dst:
        dst.write(src.read())
    config.check("-m.yaml")
    assert config.compile("-m.yaml", "-out.kiln") == "-out.kiln"
    assert (tmp_path / "-out.kiln").stat().st_size > 0
    config.check(b"-m.yaml")
    with pytest.raises(ValueError, match="null byte"):
        config.check("tiny.yaml\0x")


def test_kilnc_arguments_are_decoded_or_refused():
    assert config.kilnc(b"--version").stdout == config.kilnc("--version").stdout
    for bad in (None, True, object()):
        with pytest.raises(TypeError):
            config.kilnc(bad)
