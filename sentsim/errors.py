"""Errors the CLI prints as one line, never a traceback: the user's doing (exit 2), and a Ray worker lost to
the machine (exit 1)."""


class UsageError(Exception):
    """A bad argument, config value, path or input file. The message names what is wrong and where."""

    exit_code = 2


class InputError(UsageError):
    """Malformed input data; the message names the file and, where known, the line."""


class WorkerLost(Exception):
    """A Ray worker of a run was killed for memory, or died: the machine's doing, not a bug, and the run
    resumes. The CLI prints the message as one line and exits 1 (a run stopped short), never a traceback;
    the message names the stage, what to change in its config, and that the same command resumes."""

    exit_code = 1

    def __init__(self, line: str, detail: str = ""):
        super().__init__(line)
        self.detail = detail  # Ray's own report of the loss (the node's memory, its top users), shown above the line
