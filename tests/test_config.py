"""Config loading: YAML + overrides, validated up front, errors name the key."""

import pytest

from corpus.config import CorpusConfig
from sentsim.config import fingerprint, load_config, parse_overrides
from sentsim.errors import UsageError


def test_defaults_and_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("chunk:\n  size: 4\non_error: skip\n")
    cfg = load_config(CorpusConfig, str(cfg_file), ["chunk.size=6", "max_sentence_tokens=50"])
    assert cfg.chunk.size == 6  # command line wins over the file
    assert cfg.on_error == "skip"
    assert cfg.max_sentence_tokens == 50
    assert load_config(CorpusConfig).chunk.size == 8


@pytest.mark.parametrize(
    "override, key",
    [
        ("chunk.size=0", "chunk.size"),
        ("on_error=ignore", "on_error"),
        ("chunk.sise=3", "chunk.sise"),
        ("max_sentence_tokens=lots", "max_sentence_tokens"),
    ],
)
def test_bad_value_names_the_key(override, key):
    with pytest.raises(UsageError) as exc:
        load_config(CorpusConfig, None, [override])
    assert key in str(exc.value)
    assert "\n" not in str(exc.value)


def test_bad_files(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_config(CorpusConfig, str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("chunk: [1, 2\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(CorpusConfig, str(bad))
    lst = tmp_path / "list.yaml"
    lst.write_text("- a\n- b\n")
    with pytest.raises(UsageError, match="mapping"):
        load_config(CorpusConfig, str(lst))
    with pytest.raises(UsageError, match="key=value"):
        parse_overrides(["chunk.size"])


def test_fingerprint_is_stable_and_sensitive():
    a = fingerprint("corpus", {"x": 1, "y": [1, 2]})
    assert a == fingerprint("corpus", {"y": [1, 2], "x": 1})
    assert a != fingerprint("corpus", {"x": 2, "y": [1, 2]})


def test_yaml_boolean_words_read_as_the_choices_they_spell(tmp_path):
    # YAML 1.1 reads off/no/yes as booleans; the choice fields that spell them must still accept them.
    from sentsim.context.config import ContextTrainConfig, ScorerConfig

    assert load_config(ScorerConfig, None, ["autocast=off"]).autocast == "off"
    f = tmp_path / "train.yaml"
    f.write_text("bf16: off\nuse_gpu: no\n")
    cfg = load_config(ContextTrainConfig, str(f))
    assert (cfg.bf16, cfg.use_gpu) == ("off", "no")
    assert load_config(ContextTrainConfig, None, ["use_gpu=yes"]).use_gpu == "yes"
    with pytest.raises(UsageError, match="bf16"):  # `on` is not one of bf16's choices, and still says so
        load_config(ContextTrainConfig, None, ["bf16=on"])


def test_teacher_config_reads_the_user_cache_that_sentsim_cache_names(tmp_path, monkeypatch):
    """configs/teacher.yaml names its bundle as $SENTSIM_CACHE/...: the cache `make reference` filled, moved by
    SENTSIM_CACHE (it spelt ~/.cache/sentsim, so a moved cache was silently not the one read)."""
    from pathlib import Path

    from sentsim.harvest.config import HarvestConfig

    teacher = str(Path(__file__).resolve().parents[1] / "configs" / "teacher.yaml")
    monkeypatch.setenv("SENTSIM_CACHE", str(tmp_path / "cache"))
    cfg = load_config(HarvestConfig, teacher, ["out=o"])
    assert cfg.corpus == str(tmp_path / "cache" / "reference" / "corpus")
    assert cfg.context_models == [str(tmp_path / "cache/reference/snapshots-enwiki/tokens-150000")]
    monkeypatch.delenv("SENTSIM_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_config(HarvestConfig, teacher, ["out=o"]).index == str(tmp_path / "home/.cache/sentsim/reference/index")
    # only the variable's own name at the start of a path is the cache; ~ is still the home folder
    cfg = load_config(HarvestConfig, teacher, ["corpus=~/c", "out=$SENTSIM_CACHEX/o"])
    assert cfg.corpus == str(tmp_path / "home/c") and cfg.out == "$SENTSIM_CACHEX/o"
