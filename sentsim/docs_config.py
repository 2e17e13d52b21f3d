"""docs/configuration.md, generated from the config schemas: `python -m sentsim.docs_config [--check]`.

Every command's schema (COMMANDS) is walked field by field, nested sections as dotted keys, each with its
type, constraints and default. A field's text is its `Field(description=...)`, then the `#` comment lines
right above it, then the comments on its own lines, read from the schema's source with `tokenize` (the
schemas keep their notes, and the paper sections their defaults follow, as comments). A nested section's
row adds its class docstring. The page's hand-written introduction, everything above MARKER, is kept as
it is; the rest is rewritten. `--check` rewrites nothing and exits 1 when the page differs from what the
schemas give (tests/cli/test_docs_config.py runs it), so the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import io
import json
import re
import sys
import tokenize
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

from pydantic.fields import FieldInfo

from sentsim.config import Section

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
MARKER = ("<!-- Generated below by `python -m sentsim.docs_config` from the config schemas: edit the schemas "
          "(their Field descriptions and comments), not this text. -->")
# comments that talk to tools, not to readers
TOOL_COMMENTS = ("noqa", "type:", "pragma", "fmt:")


@dataclass(frozen=True)
class Command:
    """A command and the schema its config is validated against ("module:Class")."""

    name: str
    schema: str
    given_by: str = "`--config FILE` (YAML) and `--set key=value`"

    def schema_class(self) -> type[Section]:
        module, _, cls = self.schema.partition(":")
        return getattr(importlib.import_module(module), cls)


# Every command that takes --config (tests/cli/test_docs_config.py checks none is missing), in the order data flows.
COMMANDS = (
    Command("sentsim corpus build", "sentsim.corpus_job:CorpusJobConfig"),
    Command("sentsim index build", "sentsim.retrieval.base:IndexConfig"),
    Command("sentsim train discriminator", "sentsim.discriminator.train:DiscriminatorJob"),
    Command("sentsim cache build", "sentsim.screening.cache_job:RepCacheConfig"),
    Command("sentsim contexts", "sentsim.screening.contexts_job:ScreenConfig"),
    Command("sentsim train context", "sentsim.context.config:ContextTrainConfig"),
    Command("sentsim harvest", "sentsim.harvest.config:HarvestConfig"),
    Command("sentsim remix", "sentsim.harvest.remix:RemixConfig",
            given_by="its flags (`--lambda-disc`, `--lambda-fwd`, `--lambda-left`, `--lambda-right`, `--metric`, "
                     "`--variant`); it takes no `--config`, so `resources` keeps the defaults below"),
    Command("sentsim train surrogate", "sentsim.surrogate.config:SurrogateConfig"),
    Command("sentsim train student", "sentsim.students.config:StudentConfig"),
    Command("sentsim eval sts", "sentsim.commands.eval_sts:EvalStsConfig"),
)


# ---------------------------------------------------------------- reading the schemas' source


@dataclass(frozen=True)
class _Source:
    path: str
    fields: dict  # field name -> (first line, last line) of its statement in the class body
    doc: Optional[str]
    comments: dict  # line -> (comment text, whether the line holds nothing else)


@lru_cache(maxsize=None)
def _module_comments(path: str) -> dict:
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start
        body = tok.string.lstrip("#").strip()
        if body and not body.startswith(TOOL_COMMENTS):
            out[row] = (body, not lines[row - 1][:col].strip())
    return out


@lru_cache(maxsize=None)
def _source(cls: type) -> _Source:
    """Where each field of `cls`'s own body is declared, its docstring, and the comments of its module."""
    path = inspect.getsourcefile(cls)
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    node: ast.AST = tree
    for part in cls.__qualname__.split("."):
        node = next((n for n in ast.iter_child_nodes(node) if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:  # a class made by pydantic.create_model (StudentConfig): no statement, so no notes
            return _Source(path, {}, None, {})
    fields = {stmt.target.id: (stmt.lineno, stmt.end_lineno) for stmt in node.body
              if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
    return _Source(path, fields, ast.get_docstring(node), _module_comments(path))


def _declaring_class(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {}))


def field_comments(cls: type, name: str) -> list[str]:
    """The comment block right above field `name`'s statement (no blank line between), then the comments on the
    statement's own lines, each as one text."""
    src = _source(_declaring_class(cls, name))
    if name not in src.fields:  # a field create_model added (a student objective's section): notes are its class's
        return []
    first, last = src.fields[name]
    above, row = [], first - 1
    while row in src.comments and src.comments[row][1]:
        above.insert(0, src.comments[row][0])
        row -= 1
    inside = [src.comments[r][0] for r in range(first, last + 1) if r in src.comments]
    return [" ".join(block) for block in (above, inside) if block]


def class_doc(cls: type) -> str:
    return _source(cls).doc or ""


# ---------------------------------------------------------------- rendering


def _choices(metadata) -> Optional[tuple]:
    """The values a registry-checked field takes (`choices()` of its metadata, e.g. the Eq. 4 metrics)."""
    return next((m.choices() for m in metadata if callable(getattr(m, "choices", None))), None)


def type_name(tp, metadata=()) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _choices(metadata) is not None:  # shown as the Literal it validates like
        return " | ".join(json.dumps(a) for a in _choices(metadata))
    if tp is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0], args[1:])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return tp.__name__ if isinstance(tp, type) else str(tp)


_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("multiple_of", "a multiple of"),
           ("min_length", "length >="), ("max_length", "length <="))


def constraints(info: FieldInfo) -> list[str]:
    """The field's validation constraints, in words: bounds, pattern, finiteness, named validators."""
    out = []
    for m in info.metadata:
        out += [f"{words} {getattr(m, attr)}" for attr, words in _BOUNDS if getattr(m, attr, None) is not None]
        if getattr(m, "pattern", None):
            out.append(f"matches {m.pattern}")
        if getattr(m, "allow_inf_nan", None) is False:
            out.append("finite")
        func = getattr(m, "func", None)
        if callable(func):
            out.append(getattr(func, "in_words", None) or f"checked by {getattr(func, '__name__', 'a validator')}")
    return out


def show_value(v) -> str:
    """A default as a YAML config would spell it."""
    if isinstance(v, Section):
        v = v.model_dump()
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v else '""'
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, ensure_ascii=False)
    return repr(v)


def _section_type(tp) -> Optional[type[Section]]:
    return tp if isinstance(tp, type) and issubclass(tp, Section) else None


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    text: str


def _sentence(part: str) -> str:
    """A comment fragment ended as a sentence, so that the parts of a row's text read apart."""
    return part if part.rstrip("\"')").endswith((".", ":", ";", "?", "!")) else part + "."


def rows(cls: type[Section], prefix: str = "", defaults: Optional[Section] = None, seen: Optional[set] = None
         ) -> Iterator[Row]:
    """Every key of `cls`, depth first in declaration order. `defaults` is the instance a parent gives as this
    section's default (its values can differ from the class's own: `resources.rank` asks for 0.25 CPU)."""
    seen = set() if seen is None else seen
    for name, info in cls.model_fields.items():
        key = prefix + name
        parts = [info.description] if info.description else []
        parts += field_comments(cls, name)
        sub = _section_type(info.annotation)
        if sub is not None:
            if sub not in seen and class_doc(sub):
                parts.append(" ".join(class_doc(sub).split()))
            elif sub in seen:
                parts.append(f"The keys of `{sub.__name__}`, as above.")
            seen.add(sub)
            yield Row(key, "section", "", " ".join(_sentence(p) for p in parts))
            child_defaults = getattr(defaults, name) if defaults is not None else None
            if child_defaults is None and not info.is_required():
                child_defaults = info.get_default(call_default_factory=True)
            yield from rows(sub, key + ".", child_defaults, seen)
            continue
        if defaults is not None:
            default = f"`{show_value(getattr(defaults, name))}`"
        elif info.is_required():
            default = "required"
        else:
            default = f"`{show_value(info.get_default(call_default_factory=True))}`"
        kind = ", ".join(f"`{t}`" for t in [type_name(info.annotation, info.metadata)] + constraints(info))
        yield Row(key, kind, default, " ".join(_sentence(p) for p in parts))


def _cell(text: str) -> str:
    """Table-safe text: pipes escaped everywhere, and outside code spans a `<` that would open an HTML tag
    (GitHub drops `<out>` from `under <out>/rep_cache`)."""
    spans = text.replace("|", "\\|").split("`")
    for i in range(0, len(spans), 2):
        spans[i] = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", spans[i])
    return "`".join(spans)


def anchor(title: str) -> str:
    return title.lower().replace(" ", "-")


def reference() -> str:
    """The generated part of the page: a contents line, then one table per command."""
    out = ["**Commands:** " + " · ".join(f"[{c.name}](#{anchor(c.name)})" for c in COMMANDS), ""]
    for cmd in COMMANDS:
        cls = cmd.schema_class()
        where = Path(inspect.getsourcefile(cls)).resolve().relative_to(PAGE.parents[1]).as_posix()
        out += [f"## {cmd.name}", "", f"Schema `{cls.__name__}` (`{where}`), set by {cmd.given_by}."]
        if class_doc(cls):
            out += ["", " ".join(class_doc(cls).split())]
        out += ["", "| key | type | default | description |", "|---|---|---|---|"]
        out += [f"| `{r.key}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.text)} |" for r in rows(cls)]
        out.append("")
    return "\n".join(out)


def render(current: str) -> str:
    """The page: `current`'s introduction (above MARKER) and the reference as the schemas give it now."""
    intro = current.split(MARKER, 1)[0].rstrip("\n") if MARKER in current else "# Configuration reference"
    return f"{intro}\n\n{MARKER}\n\n{reference()}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sentsim.docs_config", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page differs from the schemas, and show how; write nothing")
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page (default: {PAGE})")
    args = parser.parse_args(argv)
    current = args.page.read_text(encoding="utf-8") if args.page.is_file() else ""
    wanted = render(current)
    if not args.check:
        if wanted != current:
            args.page.parent.mkdir(parents=True, exist_ok=True)
            args.page.write_text(wanted, encoding="utf-8")
        print(f"{args.page}: {'up to date' if wanted == current else 'written'}")
        return 0
    if wanted == current:
        return 0
    diff = list(difflib.unified_diff(current.splitlines(), wanted.splitlines(), "page", "schemas", lineterm="", n=1))
    print(f"{args.page} differs from the config schemas; run `python -m sentsim.docs_config` to regenerate it.",
          *diff[:60], sep="\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
