"""The Hub's GGUF files (runners/hub.py) and pull's choices (cli/pull.py), against the stand-in
hub on loopback (tests/support/fake_hub.py) with tiny GGUFs; the whole pull with the real model
is tests/e2e/test_pull.py."""

from __future__ import annotations

import shutil
import tomllib
from collections import namedtuple

import pytest
from huggingface_hub import constants

from localserve.cli import pull
from localserve.config import ConfigError, parse_config
from localserve.runners import hub
from tests.support.fake_hub import FakeHub
from tests.support.tiny_gguf import tiny_gguf


@pytest.fixture
def fake(tmp_path, monkeypatch):
    one = tiny_gguf(tmp_path / "one.gguf")
    files = {
        "m-Q8_0.gguf": one,
        "m-Q4_K_M.gguf": one,
        "big/m-F16-00001-of-00002.gguf": one,
        "big/m-F16-00002-of-00002.gguf": one,
    }
    server = FakeHub({"org/m-GGUF": files})
    # as HF_ENDPOINT sets them when huggingface_hub is imported
    monkeypatch.setattr(constants, "ENDPOINT", server.url)
    template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    yield server
    server.close()


def test_specs_name_a_repo_a_quant_or_a_file():
    assert hub.parse_spec("org/repo") == ("org/repo", None, None)
    assert hub.parse_spec("org/repo:q4_k_m") == ("org/repo", "Q4_K_M", None)
    assert hub.parse_spec("org/repo/sub/x.gguf") == ("org/repo", None, "sub/x.gguf")
    for bad in ("repo", "org/", "/repo", "org/repo/x.gguf:Q8_0"):
        with pytest.raises(ConfigError, match="not ORG/REPO"):
            hub.parse_spec(bad)


def test_split_files_are_one_model_and_q4_k_m_comes_first(fake, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    models = hub.list_models("org/m-GGUF")
    assert "Bearer hf_secret" in fake.authorizations  # HF_TOKEN used when set
    by_quant = {m.quant: m for m in models}
    assert set(by_quant) == {"Q8_0", "Q4_K_M", "F16"}
    assert [f.name for f in by_quant["F16"].files] == [
        "big/m-F16-00001-of-00002.gguf",
        "big/m-F16-00002-of-00002.gguf",
    ]
    assert all(f.sha256 == fake.sha["org/m-GGUF", f.name] for m in models for f in m.files)
    assert hub.pick(models, None, None, "org/m-GGUF")[0].quant == "Q4_K_M"
    assert hub.pick(models, None, "m-Q8_0.gguf", "org/m-GGUF")[0].quant == "Q8_0"
    with pytest.raises(ConfigError, match=r"has no Q2_K file \(it has F16, Q4_K_M, Q8_0\)"):
        hub.pick(models, "Q2_K", None, "org/m-GGUF")


def test_the_choice_says_what_fits_and_refuses_what_cannot(fake):
    candidates = hub.pick(hub.list_models("org/m-GGUF"), None, None, "org/m-GGUF")
    chosen, why = pull.choose("org/m-GGUF", candidates, (1 << 30, "RAM", False), named=False)
    assert chosen.quant == "Q4_K_M" and "best quantization that fits (Q4_K_M)" in why
    with pytest.raises(ConfigError, match="MiB usable in RAM: name a smaller :QUANT"):
        pull.choose("org/m-GGUF", candidates, (1000, "RAM", False), named=False)
    _, why = pull.choose("org/m-GGUF", candidates, (1000, "RAM", False), named=True)
    assert "does NOT fit" in why


def test_a_download_is_checked_and_a_full_disk_said(fake, monkeypatch):
    model = hub.pick(hub.list_models("org/m-GGUF"), "F16", None, "org/m-GGUF")[0]
    path = hub.download("org/m-GGUF", model)
    assert path.name == "m-F16-00001-of-00002.gguf"
    assert (path.parent / "m-F16-00002-of-00002.gguf").is_file()  # beside it, for llama.cpp
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10, 10, 0))
    with pytest.raises(ConfigError, match="the disk is full"):
        hub.download("org/m-GGUF", model)


def test_the_entry_is_valid_toml_and_never_clobbers(tmp_path):
    name = pull.entry_name("Qwen/Qwen3-0.6B-GGUF", "Q4_K_M")
    assert name == "qwen3-0.6b-q4_k_m"
    text = pull.entry_text(name, tmp_path / 'a "b".gguf', 4096)
    model = parse_config(text).models[name]
    assert model.path == str(tmp_path / 'a "b".gguf') and model.chat_template is None
    assert tomllib.loads(text)["models"][name]["chat_format"] == "template"
    with pytest.raises(ConfigError, match="already has"):
        pull._check_free(name, text, tmp_path / "models.toml")


@pytest.mark.parametrize(
    ("pasted", "spec"),
    [
        ("https://huggingface.co/org/repo", ("org/repo", None, None)),
        ("https://huggingface.co/org/repo/", ("org/repo", None, None)),
        ("http://www.huggingface.co/org/repo?library=gguf", ("org/repo", None, None)),
        ("https://huggingface.co/org/repo/tree/main", ("org/repo", None, None)),
        ("https://huggingface.co/org/repo/tree/main/sub", ("org/repo", None, None)),
        (
            "https://huggingface.co/org/repo/blob/main/x-Q8_0.gguf",
            ("org/repo", None, "x-Q8_0.gguf"),
        ),
        (
            "https://huggingface.co/org/repo/resolve/main/sub/x.gguf?download=true",
            ("org/repo", None, "sub/x.gguf"),
        ),
        ("hf.co/org/repo", ("org/repo", None, None)),
        ("hf.co/org/repo:q4_k_m", ("org/repo", "Q4_K_M", None)),
        ("huggingface.co/org/repo:Q4_K_M", ("org/repo", "Q4_K_M", None)),
        ("https://hf.co/org/repo:Q5_K_M", ("org/repo", "Q5_K_M", None)),
        ("  https://HuggingFace.co/org/repo  ", ("org/repo", None, None)),
    ],
)
def test_a_pasted_hub_address_is_what_pull_takes(pasted, spec):
    assert hub.parse_spec(pasted) == spec


@pytest.mark.parametrize(
    ("pasted", "why"),
    [
        ("https://github.com/org/repo", "not a Hugging Face Hub address"),
        ("ftp://huggingface.co/org/repo", "not a Hugging Face Hub address"),
        ("https://huggingface.co.evil.example/org/repo", "not a Hugging Face Hub address"),
        ("https://huggingface.co/datasets/org/data", "a Hub dataset, not a model repository"),
        ("https://huggingface.co/spaces/org/app", "a Hub space, not a model repository"),
        ("https://huggingface.co/org", "no ORG/REPO in it"),
        ("https://huggingface.co/org/repo/blob/main/README.md", "README.md is not a .gguf file"),
        ("https://huggingface.co/org/repo/blob/v2/x.gguf", "revision 'v2'"),
        ("https://huggingface.co/org/repo/discussions/3", "a repository, a file or a file list"),
        ("https://huggingface.co/org/repo/blob/main/x.gguf:Q8_0", "is not a .gguf file"),
    ],
)
def test_an_address_pull_cannot_take_says_why_in_one_line(pasted, why):
    with pytest.raises(ConfigError) as e:
        hub.parse_spec(pasted)
    assert why in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("pull: ")
