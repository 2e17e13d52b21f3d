"""CLI subcommands, one module each.

Each module defines:
    COMMAND: tuple[str, ...]        e.g. ("corpus", "build") -> `sentsim corpus build`
    HELP: str                       one line for `--help`
    add_arguments(parser) -> None   its own flags
    run(args) -> int                the single implementation; jobs/<name>.py calls the same thing

Modules are discovered automatically, so adding a command never edits a shared file.
"""
