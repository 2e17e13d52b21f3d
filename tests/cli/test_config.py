"""Config loading: YAML + overrides, validated up front, errors name the key."""

import pytest

from corpus.config import CorpusConfig
from sentsim.config import load_config, parse_overrides
from sentsim.errors import UsageError
from sentsim.identity import fingerprint


def test_defaults_and_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("chunk:\n  size: 4\non_error: skip\n")
    cfg = load_config(CorpusConfig, str(cfg_file), ["chunk.size=6", "max_sentence_tokens=50"])
    assert cfg.chunk.size == 6  # command line wins over the file
    assert cfg.on_error == "skip"
    assert cfg.max_sentence_tokens == 50
    assert load_config(CorpusConfig).chunk.size == 8
    # a section given as a mapping adds to the keys set before it, as the file's keys are kept: the --set
    # values merge with each other the way they merge with the file
    cfg = load_config(CorpusConfig, str(cfg_file), ["chunk.stride=2", "chunk={size: 5}"])
    assert (cfg.chunk.size, cfg.chunk.stride) == (5, 2)
    assert parse_overrides(["a.b=1", "a={c: 2}", "d=3"]) == {"a": {"b": 1, "c": 2}, "d": 3}


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
    with pytest.raises(UsageError, match="bf16"):  # a word that spells no switch is refused, naming the key
        load_config(ContextTrainConfig, None, ["bf16=maybe"])


_ON, _OFF, _AUTO = (("yes", "auto"), (True, True)), (("no", "off"), (False, False)), (("auto", "auto"), (None, True))


@pytest.mark.parametrize("given, context, trainer", [
    ("true", *_ON), ("yes", *_ON), ("On", *_ON), ("false", *_OFF), ("no", *_OFF), ("off", *_OFF),
    ("auto", *_AUTO), ("null", *_AUTO)])
def test_gpu_and_bf16_switches_read_alike_in_every_trainer(given, context, trainer):
    """train context stores use_gpu/bf16 as auto|yes|no and auto|off, the surrogate and student as
    bool|null and bool: each takes the other's spelling, so one config line means one thing everywhere."""
    from sentsim.context.config import ContextTrainConfig
    from sentsim.students.config import StudentConfig
    from sentsim.surrogate.config import SurrogateConfig

    sets = [f"use_gpu={given}", f"bf16={given}"]
    c = load_config(ContextTrainConfig, None, sets)
    assert (c.use_gpu, c.bf16) == context
    for schema in (SurrogateConfig, StudentConfig):
        t = load_config(schema, None, sets)
        assert (t.use_gpu, t.bf16) == trainer
    # the stored values are those of before, so runs fingerprinted with them still resume
    assert ContextTrainConfig().model_dump()["use_gpu"] == "auto" and SurrogateConfig().model_dump()["bf16"] is True


def test_teacher_config_reads_the_user_cache_that_sentsim_cache_names(tmp_path, monkeypatch):
    """configs/teacher.yaml names its bundle as $SENTSIM_CACHE/...: the cache `make reference` filled, moved by
    SENTSIM_CACHE (it spelt ~/.cache/sentsim, so a moved cache was silently not the one read)."""
    from pathlib import Path

    from sentsim.harvest.config import HarvestConfig

    teacher = str(Path(__file__).resolve().parents[2] / "configs" / "teacher.yaml")
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


# ---- every numeric value finite and in range (issue 37: a NaN λ once finished a run with every score null)


def _schemas():
    """Every config schema of the project: each Section subclass, once its module is imported."""
    import importlib
    import pkgutil

    import corpus
    import sentsim
    from sentsim.config import Section

    for pkg in (sentsim, corpus):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if not info.name.startswith(("sentsim.demo", "sentsim.cli")):
                importlib.import_module(info.name)
    seen, todo = [], list(Section.__subclasses__())
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.append(cls)
            todo += cls.__subclasses__()
    return seen


def _with_bad(kind, bad):
    """A value of type `kind` that holds `bad` where a float goes (None: `kind` holds no float)."""
    import types
    import typing

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is float:
        return bad
    if origin is typing.Annotated:
        return _with_bad(args[0], bad)
    if origin in (typing.Union, types.UnionType):
        return next((v for v in (_with_bad(a, bad) for a in args) if v is not None), None)
    if origin is dict:
        inner = _with_bad(args[1], bad)
        return None if inner is None else {"k": inner}
    if origin in (tuple, list):
        inner = [_with_bad(a, bad) for a in args if a is not Ellipsis]
        return None if all(v is None for v in inner) else [v if v is not None else 0 for v in inner]
    return None


def _float_fields(schema, prefix=""):
    """(dotted key, owning schema, field name, annotation) of every field that holds a float, nested
    sections included."""
    import typing

    from sentsim.config import Section

    for name, field in schema.model_fields.items():
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        for sub in (k for k in kinds if isinstance(k, type) and issubclass(k, Section)):
            yield from _float_fields(sub, f"{prefix}{name}.")
        if _with_bad(field.annotation, 0.0) is not None:
            yield f"{prefix}{name}", schema, name, field.annotation


def test_every_schema_refuses_nan_and_infinity_in_every_float():
    from pydantic import ValidationError

    from sentsim.config import Section

    schemas = _schemas()
    names = {s.__name__ for s in schemas}
    # the schemas of the harvest, context, scorer, screening, students, surrogate, discriminator, corpus, index
    assert {"HarvestConfig", "ContextTrainConfig", "ScorerConfig", "ScreenConfig", "ContextSetConfig", "StudentConfig",
            "SurrogateConfig", "DiscriminatorJob", "CorpusConfig", "IndexConfig", "RemixConfig",
            "StageResources", "RepCacheConfig", "EvalStsConfig"} <= names, names
    assert all(s.model_config.get("allow_inf_nan") is False for s in schemas)
    tried = 0
    for schema in schemas:
        if schema is Section:
            continue
        for key, owner, field, kind in _float_fields(schema):
            for bad in (float("nan"), float("inf"), float("-inf"), "nan", "inf"):
                with pytest.raises(ValidationError, match="finite number"):
                    owner.model_validate({field: _with_bad(kind, bad)})
                tried += 1
    assert tried > 100  # λ, learning rates, fractions, resources, ... across the schemas


def test_every_seed_of_every_schema_is_bounded_as_the_generators_take_it(tmp_path):
    """A seed past 64 bits is refused by torch's generator and a negative one by numpy's: every schema's seed
    refuses both as a config error (the context trainer's once took any int and failed in its Train worker)."""
    from typing import Annotated

    from conftest import error_line, sentsim_cli
    from pydantic import TypeAdapter, ValidationError

    seeds = {s.__name__: s.model_fields["seed"] for s in _schemas() if "seed" in s.model_fields}
    assert {"ContextTrainConfig", "HarvestConfig", "ScreenConfig", "TrainConfig", "TrainingSection"} <= set(seeds)
    for name, field in seeds.items():
        seed = TypeAdapter(Annotated[field.annotation, *field.metadata])
        assert seed.validate_python(2**63 - 1) == 2**63 - 1, name
        for bad in (-1, 2**63):
            with pytest.raises(ValidationError):
                seed.validate_python(bad)
    r = sentsim_cli("train", "context", "--corpus", tmp_path / "c", "--out", tmp_path / "o",
                    "--set", f"seed={2**64}", "--set", "executor=inline")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "seed: Input should be less than 9223372036854775808" in error_line(r.stderr)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("override, message", [
    ("scoring.lambda_fwd=.nan", "scoring.lambda_fwd: Input should be a finite number"),
    ("scoring.lambda_left=inf", "scoring.lambda_left: Input should be a finite number"),
    ("scoring.lambda_right=-0.5", "Eq. 3 weights must be 0 or more"),
    ("splits=[1.5,-0.25,-0.25]", "splits.0: Input should be less than or equal to 1"),
    ("splits=[0.5,0.2,0.2]", "splits must sum to 1"),
    ("splits=[.nan,0.5,0.5]", "splits.0: Input should be a finite number"),
    ("seed=-1", "seed: Input should be greater than or equal to 0"),
    ("scoring.ablation=no_both", None),  # fine: fwd and the discriminator term remain
    ("contexts.jaccard=.inf", "contexts.jaccard: Input should be a finite number"),
])
def test_harvest_config_values(override, message):
    from sentsim.harvest.config import HarvestConfig

    base = ["corpus=c", "out=o", "context_models=[m]", "index=i"]
    if message is None:
        load_config(HarvestConfig, None, base + [override])
        return
    with pytest.raises(UsageError) as err:
        load_config(HarvestConfig, None, base + [override])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["scoring.lambda_disc=0", "scoring.lambda_fwd=0", "scoring.lambda_left=0", "scoring.lambda_right=0"],
    ["scoring.use_fwd=false", "scoring.ablation=no_both", "scoring.lambda_disc=0"],
    ["scoring.ablation=no_discriminative", "scoring.lambda_fwd=0", "scoring.lambda_left=0", "scoring.lambda_right=0"],
])
def test_a_harvest_whose_every_score_would_be_null_is_refused(overrides):
    from sentsim.harvest.config import HarvestConfig

    with pytest.raises(UsageError, match="every pair's score would be null"):
        load_config(HarvestConfig, None, ["corpus=c", "out=o", "context_models=[m]", "index=i"] + overrides)
    # the discriminator term alone, with no discriminator to score it
    with pytest.raises(UsageError, match="discriminator term is the only one weighted"):
        load_config(HarvestConfig, None, ["corpus=c", "out=o", "context_models=[m]", "index=i", "scoring.lambda_fwd=0",
                                          "scoring.lambda_left=0", "scoring.lambda_right=0"])
    # no partner of any kind: no anchor would have a pair
    with pytest.raises(UsageError, match="no anchor would have a pair"):
        load_config(HarvestConfig, None, ["corpus=c", "out=o", "context_models=[m]", "index=i", "partners.neighbours=0",
                                          "partners.same_doc=0", "partners.random=0"])


@pytest.mark.parametrize("argv", [
    ["harvest", "--corpus", "c", "--context-models", "m", "--out", "o", "--set", "scoring.lambda_fwd=.nan"],
    ["harvest", "--corpus", "c", "--context-models", "m", "--out", "o", "--set", "splits=[1.5,-0.25,-0.25]"],
    ["train", "surrogate", "--data", "h", "--out", "o", "--set", "lr=.inf"],
    ["train", "student", "--data", "h", "--out", "o", "--set", "rankencoder.lambda_train=nan"],
    ["train", "context", "--corpus", "c", "--out", "o", "--set", "lr=-.inf"],
    ["corpus", "build", "x.jsonl", "--out", "o", "--set", "unit_bytes=1e400"],
    ["remix", "h", "--out", "o", "--lambda-fwd", "inf"],
    ["remix", "h", "--out", "o", "--lambda-left", "nan"],
])
def test_commands_refuse_non_finite_values_in_one_line(argv, tmp_path):
    from conftest import sentsim_cli

    r = sentsim_cli(*argv, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o").exists()


# ---- a config file's own faults: keys named twice, booleans for numbers, bytes that are not UTF-8


@pytest.mark.parametrize("text, message", [
    ("chunk:\n  size: 4\non_error: skip\nchunk:\n  size: 6\n", r"c.yaml:4: key 'chunk' appears twice in one mapping "
     r"\(lines 1 and 4\)"),
    ("chunk:\n  size: 4\n  stride: 2\n  size: 6\n", r"c.yaml:4: key 'size' appears twice .*lines 2 and 4"),
    ("chunk: {size: 4, size: 6}\n", r"c.yaml:1: key 'size' appears twice"),
    ("unit_bytes: " + "7" * 5001 + "\n", r"c.yaml:1: the integer 777777777777\.\.\. has 5,001 characters"),
    ("chunk: " + "[" * 100_000 + "\n", r"c.yaml: not valid YAML \(nested too deeply to read\)"),
    ("docs_per_unit: 2024-13-01\n", r"c.yaml: not valid YAML \(month must be in 1\.\.12\)"),
])
def test_config_file_faults_are_one_line_naming_file_line_and_key(tmp_path, text, message):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(UsageError, match=message) as err:
        load_config(CorpusConfig, str(f))
    assert "\n" not in str(err.value)


def test_yaml_merge_keys_may_still_be_overridden_one_by_one(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("chunk: &base {size: 4, stride: 2}\n")
    assert load_config(CorpusConfig, str(f)).chunk.size == 4
    f.write_text("on_error: skip\nchunk:\n  <<: {size: 4, stride: 2}\n  size: 6\n")
    assert load_config(CorpusConfig, str(f)).chunk.model_dump() == {"size": 6, "stride": 2}


def test_config_that_is_not_utf8_or_is_a_folder_is_one_line(tmp_path):
    f = tmp_path / "latin.yaml"
    f.write_bytes(b"chunk:\n  size: 4\non_error: sk\xe9p\n")
    with pytest.raises(UsageError, match=r"latin.yaml:3: not UTF-8 text \(byte 0xe9\); save the config as UTF-8"):
        load_config(CorpusConfig, str(f))
    with pytest.raises(UsageError, match=r": is a folder; --config takes a YAML file"):
        load_config(CorpusConfig, str(tmp_path))
    with pytest.raises(UsageError, match=r"override docs_per_unit: key 'a' appears twice"):
        load_config(CorpusConfig, None, ["docs_per_unit={a: 1, a: 2}"])


def _number_fields(schema, prefix=""):
    """(dotted key, owning schema, field name, annotation, a boolean where it must fail or None) of every field
    that holds an int or a float and no bool, nested sections included."""
    import typing

    from sentsim.config import Section

    for name, field in schema.model_fields.items():
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        for sub in (k for k in kinds if isinstance(k, type) and issubclass(k, Section)):
            yield from _number_fields(sub, f"{prefix}{name}.")
        for kind in (int, float):
            value = _with_bad(field.annotation, True) if kind is float else _with_int(field.annotation)
            if value is not None:
                yield f"{prefix}{name}", schema, name, value
                break


def _with_int(kind):
    """A value of type `kind` with True where an int goes and no bool does (None: `kind` holds no such int)."""
    import types
    import typing

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is int:
        return True
    if origin is typing.Annotated:
        return _with_int(args[0])
    if origin in (typing.Union, types.UnionType):
        return None if bool in args else next((v for v in map(_with_int, args) if v is not None), None)
    if origin is dict:
        inner = _with_int(args[1])
        return None if inner is None else {"k": inner}
    if origin in (tuple, list):
        inner = [_with_int(a) for a in args if a is not Ellipsis]
        return None if all(v is None for v in inner) else [v if v is not None else 0 for v in inner]
    return None


def test_every_schema_refuses_a_boolean_in_every_number():
    """`docs_per_unit: true` was read as 1: pydantic takes a bool for an int or a float. Every such field of
    every schema, and every number inside a list, tuple or dict field, refuses it."""
    from pydantic import ValidationError

    from sentsim.config import Section

    tried = set()
    for schema in _schemas():
        if schema is Section:
            continue
        for dotted, owner, field, value in _number_fields(schema):
            with pytest.raises(ValidationError, match="expected a number, not the boolean True"):
                owner.model_validate({field: value})
            tried.add(dotted)
    assert {"docs_per_unit", "chunk.size", "unit_bytes", "seed", "splits", "scoring.lambda_fwd"} <= tried, tried
    assert len(tried) > 100


@pytest.mark.parametrize("override, message", [
    ("docs_per_unit=true", "docs_per_unit: expected a number, not the boolean True"),
    ("chunk.size=false", "chunk.size: expected a number, not the boolean False"),
    ("max_in_flight=true", "max_in_flight: expected a number, not the boolean True"),  # an int or None
])
def test_a_boolean_for_a_number_names_the_key(override, message):
    with pytest.raises(UsageError, match=message):
        load_config(CorpusConfig, None, [override])


def test_booleans_are_still_read_where_a_field_takes_one():
    from sentsim.context.config import ScorerConfig

    assert load_config(ScorerConfig, None, ["use_fwd=false"]).use_fwd is False
    assert load_config(ScorerConfig, None, ["use_fwd=no"]).use_fwd is False  # YAML 1.1's word, read by pydantic


@pytest.mark.parametrize("splits", ["[0.98,0.02,0.01]", "[0.9,0.1,0.01]", "[0.5,0.25,0.24]"])
def test_splits_that_miss_one_by_a_hundredth_are_refused(splits):
    """The one sum test was off by 0.1; 1.01 and 0.99 must fail too."""
    from sentsim.harvest.config import HarvestConfig

    with pytest.raises(UsageError, match="splits must sum to 1"):
        load_config(HarvestConfig, None, ["corpus=c", "out=o", "context_models=[m]", "index=i", f"splits={splits}"])
    load_config(HarvestConfig, None, ["corpus=c", "out=o", "context_models=[m]", "index=i", "splits=[0.7,0.2,0.1]"])


def test_commands_refuse_config_faults_in_one_line(tmp_path):
    from conftest import sentsim_cli

    (tmp_path / "x.jsonl").write_text('{"paragraphs": ["A fine document."]}\n')
    (tmp_path / "dup.yaml").write_text("chunk:\n  size: 4\n  size: 6\n")
    (tmp_path / "bool.yaml").write_text("docs_per_unit: true\n")
    (tmp_path / "latin.yaml").write_bytes(b"on_error: sk\xe9p\n")
    for name, needle in (("dup.yaml", "key 'size' appears twice"), ("bool.yaml", "not the boolean True"),
                         ("latin.yaml", "latin.yaml:1: not UTF-8 text")):
        r = sentsim_cli("corpus", "build", "x.jsonl", "--out", "o", "--config", name, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_a_rep_cache_without_a_discriminator_in_use_is_refused_in_one_line(tmp_path):
    """contexts.rep_cache is read only where a discriminator screens; given without one (no --discriminator,
    or contexts.mode random or pool) it was validated and then ignored. Each command that takes it refuses it
    in one line naming the key, before any input is read or anything is written."""
    from conftest import error_line, sentsim_cli

    harvest = ("harvest", "--corpus", "c", "--index", "i", "--context-models", "m", "--executor", "inline")
    contexts = ("contexts", "--corpus", "c", "--index", "i", "--executor", "inline")
    for i, (cmd, sets) in enumerate([(harvest, ()), (harvest, ("contexts.mode=random",)),
                                     (harvest, ("contexts.mode=pool",)), (contexts, ()),
                                     (contexts, ("contexts.mode=random",))]):
        over = [x for kv in ("contexts.rep_cache=cache", *sets) for x in ("--set", kv)]
        r = sentsim_cli(*cmd, "--out", f"o{i}", *over, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (cmd, sets, r.stderr)
        line = error_line(r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "contexts.rep_cache: no discriminator is in use" in line and "--discriminator" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_another_commands_config_file_is_named_as_such(tmp_path, capsys):
    """`--config` given a file of another command: one line saying so, not a list of every unknown key;
    a file with a typo or two still names each key."""
    from conftest import ROOT

    from sentsim.cli import main

    code = main(["train", "context", "--corpus", str(tmp_path), "--out", str(tmp_path / "o"),
                 "--config", str(ROOT / "configs" / "teacher.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("sentsim: error: ") and "is it another command's config?" in err, err
    assert "corpus, index, context_models and" in err and err.count("\n") == 1
    typo = tmp_path / "typo.yaml"
    typo.write_text("chunk:\n  size: 4\non_eror: skip\n")
    with pytest.raises(UsageError, match="on_eror: unknown key"):
        load_config(CorpusConfig, str(typo))
