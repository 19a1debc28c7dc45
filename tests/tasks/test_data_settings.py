"""The data settings of the tasks (``addnorm.tasks.data_settings``), checked alike in
the lm, translate and dit configs when they are built: each bad combination refused by name, and
paths made absolute (so a run resumed from another folder names the same files).

Provenance: the documented rules of ``check_data_settings``; the identity that a config
round-trips through ``to_dict``/``from_dict``.
"""

from __future__ import annotations

import pytest

from addnorm.tasks.dit import DiTTaskConfig
from addnorm.tasks.lm import LMTaskConfig
from addnorm.tasks.translate import TranslateTaskConfig


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tokenizer": "bpe"}, "tokenizer bpe needs data"),
        ({"data": "x.txt", "vocab_size": 500}, "applies to tokenizer bpe only"),
        ({"data": "x.txt", "tokenizer": "bpe", "vocab_size": 100}, "must be from 259"),
        ({"data": "x.txt", "val_fraction": 0.9}, "val_fraction must be <= 0.5"),
        ({"cache_dir": "c"}, "cache_dir needs data"),
        ({"data": ""}, "non-empty str"),
    ],
)
def test_data_settings_are_checked_when_the_config_is_built(settings, message):
    with pytest.raises((ValueError, TypeError), match=message):
        LMTaskConfig(**settings)


def test_data_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = LMTaskConfig(data="texts/*.txt", tokenizer="tok/tokenizer.json", cache_dir="~/c")
    assert cfg.data == str(tmp_path / "texts" / "*.txt")
    assert cfg.tokenizer == str(tmp_path / "tok" / "tokenizer.json")
    assert not cfg.cache_dir.startswith("~")
    assert LMTaskConfig.from_dict(cfg.to_dict()) == cfg


def test_the_translate_config_checks_its_data_settings():
    with pytest.raises(ValueError, match="valid, shared_vocab need data"):
        TranslateTaskConfig(valid="v.tsv", shared_vocab=True)
    with pytest.raises(TypeError, match="shared_vocab must be a bool"):
        TranslateTaskConfig(data="p.tsv", shared_vocab=1)



@pytest.mark.parametrize(("settings", "message"), [
    ({"image_size": 16}, "image_size need data"),
    ({"val_fraction": 0.3, "image_size": 8}, "image_size and val_fraction need data"),
    ({"data": "pics", "image_size": 10**6}, r"image_size \(1000000\) must be <= "),
    ({"data": "pics", "val_fraction": 0.0}, "val_fraction must be > 0"),
    ({"data": ""}, "non-empty str"),
    ({"follow_links": True}, "follow_links need data"),
])
def test_image_settings_are_checked_when_the_config_is_built(settings, message):
    with pytest.raises((ValueError, TypeError), match=message):
        DiTTaskConfig(**settings)
    assert DiTTaskConfig(data="pics").data.startswith("/")  # made absolute


def test_the_reading_settings_are_checked_and_need_data():
    """``follow_links`` and ``header`` (issue 41) say how a user's files are read."""
    with pytest.raises(ValueError, match="follow_links needs data"):
        LMTaskConfig(follow_links=True)
    with pytest.raises(ValueError, match="header needs data"):
        TranslateTaskConfig(header="yes")
    with pytest.raises(TypeError, match="follow_links"):
        TranslateTaskConfig(data="p.tsv", follow_links="yes")
    with pytest.raises(ValueError, match="header"):
        TranslateTaskConfig(data="p.tsv", header="maybe")
    cfg = TranslateTaskConfig(data="p.tsv", follow_links=True, header="no")
    assert TranslateTaskConfig.from_dict(cfg.to_dict()) == cfg
    saved = cfg.to_dict()
    del saved["follow_links"], saved["header"]  # a run saved before the settings existed
    assert TranslateTaskConfig.from_dict(saved).header == "auto"
