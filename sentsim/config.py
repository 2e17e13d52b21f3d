"""Validated job configuration: a YAML file plus `--set key=value` overrides.

Every job has one pydantic schema. Unknown keys are rejected and a bad value is reported by its
dotted key, e.g. `chunk.size: Input should be greater than or equal to 1 (got 0)`.
Defaults follow the papers; the comment beside each default cites its section.
"""

from __future__ import annotations

import argparse
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterable, Literal, Mapping, Optional, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from sentsim.errors import UsageError

T = TypeVar("T", bound="Section")


# the user cache (`make reference` builds the reference teacher there); SENTSIM_CACHE moves it
DEFAULT_CACHE = "~/.cache/sentsim"
CACHE_VAR = "$SENTSIM_CACHE"


def user_cache() -> Path:
    """SENTSIM_CACHE, or ~/.cache/sentsim: where `make reference` and the benches keep what they build."""
    return Path(os.environ.get("SENTSIM_CACHE") or DEFAULT_CACHE).expanduser()


def expand_path(p):
    """A path as a config file may spell it: `$SENTSIM_CACHE/...` is in the user cache (configs/teacher.yaml,
    whatever SENTSIM_CACHE says or its default), `~/...` in the home folder. Anything else is returned as is."""
    if not isinstance(p, str):
        return p
    if p == CACHE_VAR or p.startswith(CACHE_VAR + "/"):
        return str(user_cache()) + p[len(CACHE_VAR):]
    return os.path.expanduser(p) if p.startswith("~") else p


class Section(BaseModel):
    """Base for every config schema: strict about unknown keys, immutable once validated, and no NaN or
    infinity in any float (a weight of `.nan` or `inf` would make every harvested score null)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)
    # keys added after runs were made, with the value those runs had: `without_added_later` leaves such a key
    # out of a fingerprint while it holds that value, so the runs keep theirs
    ADDED_LATER: ClassVar[Mapping[str, Any]] = {}

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads true as 1 where an int or float goes: `docs_per_unit: true` would be one document
        per unit. A boolean is refused wherever the field (or an item of it) expects a number, not a boolean."""
        field = cls.model_fields.get(info.field_name)
        where = None if field is None else bool_for_number(field.annotation, value)
        if where is not None:
            raise ValueError(f"expected a number, not the boolean {where}")
        return value


def without_added_later(values: dict, added_later: Mapping[str, Any]) -> dict:
    """`values` (a config dump) less each key of `added_later` that holds the value runs made before it had."""
    return {k: v for k, v in values.items() if not (k in added_later and v == added_later[k])}


def _leaf_types(kind: Any) -> set:
    """The plain types a field annotation admits: int, float, bool, str, ... (Literal: its values' types)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        return _leaf_types(args[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_leaf_types(a) for a in args))
    if origin is Literal:
        return {type(a) for a in args}
    return {kind}


def bool_for_number(kind: Any, value: Any, at: str = "") -> Optional[str]:
    """Where `value` holds a boolean that `kind` reads as a number ("True", or "True (item 2)"), else None."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        return bool_for_number(args[0], value, at)
    if isinstance(value, bool):
        leaves = _leaf_types(kind)
        return f"{value}{at}" if leaves & {int, float} and bool not in leaves else None
    if origin in (typing.Union, types.UnionType):
        return next((w for w in (bool_for_number(a, value, at) for a in args) if w is not None), None)
    if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)) and args:
        items = [a for a in args if a is not Ellipsis]
        kinds = items if origin is tuple and len(items) == len(args) else [items[0]] * len(value)
        return next((w for i, (k, v) in enumerate(zip(kinds, value))
                     if (w := bool_for_number(k, v, f" (item {i})")) is not None), None)
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return next((w for k, v in value.items() if (w := bool_for_number(args[1], v, f" (key {k!r})")) is not None),
                    None)
    return None


# A random seed: numpy's generators refuse negative ones, and torch's those past 64 bits.
Seed = Annotated[int, Field(ge=0, lt=2**63)]

class SpeltSwitch:
    """A GPU or bf16 switch read alike in every config, whichever way its schema stores it: true, yes and on
    mean `yes`; false, no and off `no`; null and auto `auto`; anything else is left for the schema to refuse."""

    in_words = "true/yes/on, false/no/off and auto/null read alike"  # docs/configuration.md's constraint cell

    def __init__(self, *, yes: Any, no: Any, auto: Any):
        self.yes, self.no, self.auto = yes, no, auto

    def __call__(self, value: Any) -> Any:
        word = value.strip().lower() if isinstance(value, str) else value
        if word is None or word == "auto":
            return self.auto
        if isinstance(word, bool):
            return self.yes if word else self.no
        return self.yes if word in ("yes", "true", "on") else self.no if word in ("no", "false", "off") else value


# The two ways the schemas store them (one spelling for the user, above); each keeps its stored values, so
# the runs fingerprinted with them keep their fingerprints.
GpuChoice = Annotated[Literal["auto", "yes", "no"], BeforeValidator(SpeltSwitch(yes="yes", no="no", auto="auto"))]
Bf16Choice = Annotated[Literal["auto", "off"], BeforeValidator(SpeltSwitch(yes="auto", no="off", auto="auto"))]
GpuWhenThere = Annotated[Optional[bool], BeforeValidator(SpeltSwitch(yes=True, no=False, auto=None))]
Bf16WhenThere = Annotated[bool, BeforeValidator(SpeltSwitch(yes=True, no=False, auto=True))]


class YamlRefusal(yaml.constructor.ConstructorError):
    """A YAML document that parses but that a config must not hold; its problem is the message for the user."""


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2's booleans (true/false only), that refuses a key named twice in one mapping and
    an integer too long for Python to read, each as a YamlRefusal that names the line.

    YAML 1.1 also reads yes/no/on/off as booleans, which turned `autocast: off` and `--set use_gpu=no`
    into False and had them refused by fields whose choices are those words. Read as strings, they still
    validate as booleans where a field is a bool (pydantic accepts them).
    """

    def construct_mapping(self, node, deep=False):
        # YAML itself keeps the last of two values of one key, silently
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults` may be overridden key by key
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base constructor says so
                    continue
                if first is not None:
                    raise YamlRefusal(None, None, f"key {key!r} appears twice in one mapping (lines {first} and "
                                      f"{line}); keep one", key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_checked_int(self, node):
        try:
            return self.construct_yaml_int(node)
        except ValueError:  # Python reads at most sys.get_int_max_str_digits() digits
            raise YamlRefusal(None, None, f"the integer {node.value[:12]}... has {len(node.value):,} characters, "
                              "too many to read", node.start_mark) from None


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_checked_int)
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        child = node.get(k)
        if not isinstance(child, dict):
            child = {}
            node[k] = child
        node = child
    node[keys[-1]] = value


def parse_overrides(pairs: Iterable[str]) -> dict:
    """`["chunk.size=8", "on_error=skip"]` -> nested dict; values are parsed as YAML scalars."""
    tree: dict = {}
    for item in pairs or []:
        if "=" not in item:
            raise UsageError(f"override {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise UsageError(f"override {item!r} has an empty key")
        try:
            value = _yaml(raw) if raw != "" else ""
        except YamlRefusal as exc:
            raise UsageError(f"override {key}: {exc.problem}") from None
        except (yaml.YAMLError, ValueError, RecursionError):  # not YAML: the value is the text as typed
            value = raw
        nested: dict = {}
        _set_dotted(nested, key, value)
        # merged as the config file and the --set values are: a mapping given to a section (`contexts={size:
        # 3}`) adds its keys to those set before it, rather than dropping them
        tree = _merge(tree, nested)
    return tree


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _shown(value: Any, limit: int = 80) -> str:
    """A refused value as the message shows it: its repr, cut to `limit` characters (a value may be huge)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an integer too long to print, a list nested too deeply
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."


def format_validation_error(exc: ValidationError, flags: Mapping[str, str] | None = None) -> str:
    """pydantic's errors on one line. A required key missing from a command's config is named by the flag
    that gives it (`flags`: key -> flag), the way most users give it: `--out is required (or out: in
    --config)`, not `out: Field required`; every other fault keeps its dotted key."""
    flags = flags or {}
    missing, parts = [], []
    for err in exc.errors():
        key = ".".join(str(x) for x in err["loc"]) or "<root>"
        if err.get("type") == "missing" and key in flags:
            missing.append(f"{flags[key]} is required (or {key}: in --config)")
            continue
        msg = err["msg"]
        if err.get("type") == "extra_forbidden":
            msg = "unknown key"
        got = err.get("input")
        # a validator's own message names the values it refuses; its input is the whole section
        shown = "" if err.get("type") in ("extra_forbidden", "missing", "value_error") else f" (got {_shown(got)})"
        if err.get("type") == "value_error":
            msg = msg.removeprefix("Value error, ")
        parts.append(f"{msg}" if key == "<root>" else f"{key}: {msg}{shown}")
    return "; ".join(missing + (["invalid config: " + "; ".join(parts)] if parts else []))


def _read_config_file(path: str) -> dict:
    """The mapping of a YAML config file, or a one-line UsageError naming the file (and line) of its fault."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{path}: is a folder; --config takes a YAML file")
    if not p.is_file():
        raise UsageError(f"config file not found: {path}")
    try:
        raw = p.read_bytes()
        text = raw.decode("utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the config as UTF-8"
                         ) from None
    try:
        loaded = _yaml(text)
    except YamlRefusal as exc:
        raise UsageError(f"{path}:{exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f":{line + 1}" if line is not None else ""
        problem = getattr(exc, "problem", None)
        raise UsageError(f"{path}{where}: not valid YAML" + (f" ({problem})" if problem else "")) from None
    except RecursionError:
        raise UsageError(f"{path}: not valid YAML (nested too deeply to read)") from None
    except ValueError as exc:  # a value YAML resolves but Python cannot build, such as the date 2024-13-01
        raise UsageError(f"{path}: not valid YAML ({exc})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UsageError(f"{path}: the config must be a mapping of keys to values")
    return loaded


def load_config(schema: type[T], path: str | None = None, overrides: Iterable[str] = (), *,
                flags: Mapping[str, str] | None = None, **explicit: Any) -> T:
    """Build `schema` from an optional YAML file, then dotted overrides, then explicit keyword values.
    `flags` maps the keys a command takes from its own flags to those flags, so that a required one
    given nowhere is named as the flag (format_validation_error)."""
    data = _read_config_file(path) if path else {}
    unknown = [str(k) for k in data if k not in schema.model_fields]
    if len(unknown) >= 3 and len(unknown) > len(data) - len(unknown):  # rather than a list of each unknown key
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise UsageError(f"{path}: most of its keys ({shown}) are not settings of this command; is it another "
                         "command's config? (docs/configuration.md lists each command's keys)")
    data = _merge(data, parse_overrides(overrides))
    data = _merge(data, {k: v for k, v in explicit.items() if v is not None})
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc, flags)) from None


def add_run_arguments(parser, executor: str = "ray", passes: str = "") -> None:
    """The flags of every job that writes a resumable run: --force-new, --executor and --max-units.
    `executor` is the command's default: Ray for the jobs that score or parse, inline for `remix`,
    whose seconds of arithmetic a unit would cost less than a local Ray's start-up. `passes`: the runs the
    job builds first, each bounded by --max-units alike, for a job that has them."""
    parser.add_argument("--force-new", action="store_true",
                        help="discard the run at --out, whatever its settings, and start over (without it, a run "
                             "of these settings resumes and one of others is refused)")
    parser.add_argument("--executor", choices=["ray", "inline"], default=executor,
                        help=f"ray: Ray actor pools or tasks; inline: everything in this process (default: {executor})")
    parser.add_argument("--max-units", type=unit_count, default=None, metavar="N",
                        help="run at most N of the pending units" + (f" of each pass ({passes})" if passes else "")
                             + ", then stop; the same command resumes the run")


def whole_number(what: str, least: int = 1):
    """An argparse type for a count flag: a whole number of `what`, `least` or more. A flag's bad value is
    refused in the flag's own name (`argument --chunk-size: expected ...`), before the config would refuse it
    under its key (`chunk.size`), a name the user did not type."""
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"expected a whole number of {what}, {least} or more (got {text!r})")
        return int(text)

    parse.__name__ = f"whole number of {what}"  # argparse names a type by it in its own errors
    return parse


# argparse type of --max-units (the CLI's and the benches')
unit_count = whole_number("units")


def run_exit_code(manifest: dict, max_units, force_new: bool = False) -> int:
    """A resumable command's exit status: 0 when its run is complete, or when --max-units stopped it
    as asked (it says so, and how to continue: the same command, less a --force-new, which would start
    the run over again); 1 when it stopped for another reason."""
    if manifest.get("complete"):
        return 0
    if max_units is None:
        return 1
    # the command's summary line(s) above count only the units done so far: say so
    print(f"stopped after --max-units {max_units}: {manifest['completed_units']}/{manifest['planned_units']} "
          f"units done (the counts above are theirs); run the same command again"
          + (" without --force-new (with it, the run starts over)" if force_new else "") + " to continue")
    return 0


def add_config_arguments(parser, *, ray: bool = True) -> None:
    """The flags every job shares: --config, --set, and --address where the job runs on Ray (`ray`); a
    command that never starts Ray takes no --address, which would otherwise be accepted and do nothing."""
    parser.add_argument("--config", metavar="FILE", help="YAML config file (keys: docs/configuration.md)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key, dotted for nested keys (repeatable)",
    )
    if ray:
        parser.add_argument(
            "--address", default=None,
            help="Ray cluster to attach to (default: RAY_ADDRESS if set, else a local in-process Ray)",
        )
