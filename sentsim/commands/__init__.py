"""CLI subcommands, one module each.

Each module defines:
    COMMAND: tuple[str, ...]        e.g. ("corpus", "build") -> `sentsim corpus build`
    HELP: str                       one line for `--help`
    add_arguments(parser) -> None   its own flags
    run(args) -> int                the single implementation; jobs/<name>.py calls the same thing

Modules are discovered automatically, so adding a command never edits a shared file.
"""

from __future__ import annotations

from typing import Mapping


def load_flagged_config(schema, args, flags: Mapping[str, str], **explicit):
    """The command's config, as sentsim.config.load_config builds it from --config, --set and the flags'
    values (`explicit`); a required key that none of them gives is named by its flag, the one way most
    users give it (`--out is required (or out: in --config)`), not as pydantic's `out: Field required`."""
    from sentsim.config import load_config
    from sentsim.errors import UsageError

    try:
        return load_config(schema, args.config, args.overrides, **explicit)
    except UsageError as exc:
        prefix = "invalid config: "
        text = str(exc)
        if not text.startswith(prefix):
            raise
        named = {f"{key}: Field required": f"{flag} is required (or {key}: in --config)"
                 for key, flag in flags.items()}
        parts = text.removeprefix(prefix).split("; ")
        if not any(p in named for p in parts):
            raise
        missing = [named[p] for p in parts if p in named]
        rest = [p for p in parts if p not in named]
        raise UsageError("; ".join(missing + ([prefix + "; ".join(rest)] if rest else []))) from None
