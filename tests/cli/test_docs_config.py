"""docs/configuration.md is generated from the config schemas (`python -m sentsim.docs_config`): these tests
fail when the page and the schemas disagree, when a command with a config has no section, and when the
generator misreads a schema's notes."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field

from sentsim import docs_config
from sentsim.config import Section

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sentsim.docs_config", "--check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_page_matches_the_schemas():
    r = _check()
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_command_that_takes_a_config_has_a_section():
    from sentsim.cli import _command_modules

    commands, with_config = set(), set()
    for mod in _command_modules():
        name = "sentsim " + " ".join(mod.COMMAND)
        commands.add(name)
        parser = argparse.ArgumentParser()
        mod.add_arguments(parser)
        if "--config" in parser._option_string_actions:
            with_config.add(name)
    documented = {c.name for c in docs_config.COMMANDS}
    assert with_config <= documented, f"commands with --config but no section: {sorted(with_config - documented)}"
    assert documented <= commands, f"sections for commands that do not exist: {sorted(documented - commands)}"
    for c in docs_config.COMMANDS:
        assert issubclass(c.schema_class(), Section), c


def test_check_fails_on_a_drifted_page_and_regenerating_keeps_the_introduction(tmp_path):
    page = tmp_path / "configuration.md"
    text = PAGE.read_text(encoding="utf-8")
    row = "| `chunk.size` | `int`, `>= 1`, `<= 1024` | `8` |"
    assert row in text
    page.write_text(text.replace(row, row.replace("`8`", "`9`")), encoding="utf-8")

    r = _check("--page", str(page))
    assert r.returncode == 1
    assert "run `python -m sentsim.docs_config`" in r.stdout and "chunk.size" in r.stdout

    r = subprocess.run([sys.executable, "-m", "sentsim.docs_config", "--page", str(page)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert page.read_text(encoding="utf-8") == text  # the hand-written introduction survives
    assert _check("--page", str(page)).returncode == 0


# ---------------------------------------------------------------- how a schema's notes are read


class _Inner(Section):
    """An inner section.

    Its docstring spans lines."""

    n: int = Field(2, ge=1)  # trailing note
    name: str = "x"


class _Toy(Section):
    # a block above the field,
    # on two lines
    size: int = Field(8, ge=1, le=10, description="what it is")  # §1.2 of a paper
    # a note about something else, left apart by a blank line

    plain: bool = True
    multi: Optional[float] = Field(
        None,  # inside the call
        gt=0,
    )
    choice: Literal["a", "b|c"] = "a"  # noqa: E501
    path: str = Field("", description="files go under <out>/cache, `<kept>` in code")
    inner: _Inner = _Inner(n=5)
    again: _Inner = _Inner()
    items: list[str] = Field(default_factory=list)


def test_rows_read_descriptions_comments_types_and_the_parents_defaults():
    rows = {r.key: r for r in docs_config.rows(_Toy)}
    assert list(rows) == ["size", "plain", "multi", "choice", "path", "inner", "inner.n", "inner.name", "again",
                          "again.n", "again.name", "items"]
    assert rows["size"].text == "what it is. a block above the field, on two lines. §1.2 of a paper."
    assert rows["size"].type == "`int`, `>= 1`, `<= 10`" and rows["size"].default == "`8`"
    assert rows["plain"].text == ""  # a comment that a blank line separates is not the field's
    assert rows["multi"].text == "inside the call." and rows["multi"].type == "`float | null`, `> 0`"
    assert rows["multi"].default == "`null`"
    assert rows["choice"].text == "" and rows["choice"].type == '`"a" | "b|c"`'  # tool comments are dropped
    assert rows["inner"].type == "section" and "An inner section. Its docstring spans lines." in rows["inner"].text
    assert rows["inner.n"].default == "`5`" and rows["again.n"].default == "`2`"  # the parent's instance decides
    assert rows["inner.n"].text == "trailing note."
    assert "as above" in rows["again"].text
    assert rows["items"].default == "`[]`" and rows["items"].type == "`list[str]`"
    assert rows["path"].default == '`""`'


def test_a_model_built_by_create_model_keeps_its_bases_notes_and_its_sections_own():
    """StudentConfig is built with create_model (a section per registered student objective): the fields it
    adds have no statement, hence no notes of their own, while its base's fields and the sections' keys keep theirs."""
    from pydantic import create_model

    built = create_model("Built", __base__=_Toy, __module__=__name__, added=(_Inner, _Inner(n=3)))
    rows = {r.key: r for r in docs_config.rows(built)}
    assert rows["size"].text == "what it is. a block above the field, on two lines. §1.2 of a paper."
    assert rows["added"].type == "section" and rows["added"].text == "The keys of `_Inner`, as above."
    assert rows["added.n"].default == "`3`" and rows["added.n"].text == "trailing note."
    assert docs_config.class_doc(built) == ""


def test_cells_escape_pipes_and_html_like_tags_outside_code():
    assert docs_config._cell("under <out>/x, `<kept>`, c< and |C_s|") == "under &lt;out>/x, `<kept>`, c< and \\|C_s\\|"
