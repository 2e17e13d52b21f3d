"""`sentsim eval sts`: the STS suite (STS12-16, STS-B, SICK-R) for a model, a scored-pair file or TF-IDF."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import Field, field_validator

from sentsim.config import Section, add_config_arguments, load_config, whole_number
from sentsim.errors import UsageError
from sentsim.out_paths import check_out, probe_file_out

COMMAND = ("eval", "sts")
HELP = "Spearman/Pearson on STS12-16, STS-B and SICK-R for a model, a scored-pair file or TF-IDF"


class EvalStsConfig(Section):
    """Spearman rank correlation of cosine vs gold (003 §4.1), all pairs of a year pooled (the SentEval
    "all" setting; §4.1 does not say how a year's subsets are aggregated)."""

    batch_size: int = Field(64, ge=1)
    # cpu, mps or cuda[:N] (default: cuda when present, else cpu); cuda on a machine without it is refused
    device: Optional[str] = Field(None, pattern=r"^(cpu|mps|cuda(:[0-9]+)?)$")
    tasks: Optional[list[str]] = Field(None, min_length=1)  # default: every standard task found under --data

    @field_validator("tasks", mode="before")
    @classmethod
    def _comma_separated(cls, v):
        """`--set tasks=STSb,SICK-R` as `--tasks` spells it, not only the YAML list `[STSb, SICK-R]`."""
        return [t.strip() for t in v.split(",") if t.strip()] if isinstance(v, str) else v

    @field_validator("tasks")
    @classmethod
    def _each_once(cls, v):
        """A task named twice is scored once: twice, it would count double in the Avg. line."""
        return None if v is None else list(dict.fromkeys(v))


def add_arguments(parser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="PATH",
                     help="sentence-transformers folder, cross-encoder or transformers encoder")
    src.add_argument("--scores", metavar="FILE",
                     help="scored pairs (.parquet/.csv/.jsonl with s1, s2, score), "
                          "or a harvest run (local or s3://: its completed pairs/ shards)")
    src.add_argument("--tfidf", action="store_true", help="the TF-IDF cosine baseline")
    parser.add_argument("--data", required=True, metavar="DIR",
                        help="folder holding STS20xx-en-test/, stsbenchmark/, SICK/")
    parser.add_argument("--tasks", default=None,
                        help="comma-separated subset, e.g. STSb,SICK-R (default: every standard task under --data)")
    parser.add_argument("--batch-size", type=whole_number("items"), default=None, metavar="N",
                        help="--model: sentences (or pairs, for a cross-encoder) encoded at once (default 64)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown")
    add_config_arguments(parser, ray=False)  # it scores in this process


def run(args) -> int:
    from sentsim.evaluation import (
        PairFileScorer,
        TfidfScorer,
        discover_tasks,
        evaluate,
        format_table,
        load_model_scorer,
        to_json,
        to_markdown,
    )

    for flag, value in (("--data", args.data), ("--model", args.model)):  # else Path() makes s3://b/x into s3:/b/x
        if value and "://" in value:
            raise UsageError(f"{flag} {value}: read from a local folder (or a shared file system that every node "
                             "mounts), not an object store; copy it there first (--scores alone reads s3://)")
    if args.model:  # its model card records the scores, in place
        from sentsim.out_paths import refuse_relative_in_job

        refuse_relative_in_job(args.model, "--model", uri_ok=False)
    for flag in ("--json", "--markdown"):  # a report written over an input would destroy it
        check_out(getattr(args, flag[2:]), {"--model": args.model, "--scores": args.scores, "--data": args.data},
                  out_flag=flag, folder=False, local="reports")
    if args.json and args.markdown and Path(args.json).resolve() == Path(args.markdown).resolve():
        raise UsageError(f"--json and --markdown both name {args.json}: the second report would replace the "
                         "first; give each its own file")
    for path in (args.json, args.markdown):  # a report the disk will not take fails now, not after the scoring
        if path:
            probe_file_out(path)
    tasks = None if args.tasks is None else [t.strip() for t in args.tasks.split(",") if t.strip()]
    if tasks == []:  # an empty --tasks names no task: never taken as 'every task'
        raise UsageError(f"--tasks {args.tasks!r} names no task; give a comma-separated subset such as "
                         "STSb,SICK-R, or leave --tasks out for every task")
    cfg = load_config(EvalStsConfig, args.config, args.overrides, batch_size=args.batch_size, tasks=tasks)
    if args.model and (cfg.device or "").startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"device={cfg.device}, but this machine has no CUDA device; leave device unset "
                             "(cuda when present, else cpu) or set device=cpu")
    loaded, missing = discover_tasks(args.data, cfg.tasks)  # bad data fails before any model loads
    model_dir = None
    if args.model:
        from sentsim.evaluation.model_folder import check_model_folder

        model_dir = check_model_folder(args.model)  # a folder cut short is refused before a loader reads it
        scorer = load_model_scorer(str(model_dir), cfg.batch_size, cfg.device)
    elif args.scores:
        scorer = PairFileScorer(args.scores)
    else:
        scorer = TfidfScorer()
    report = evaluate(scorer, loaded, missing)
    if args.scores and all(t.scored == 0 for t in report.tasks):
        raise UsageError(f"--scores {args.scores}: none of its pairs match a pair of the evaluated tasks")
    print(format_table(report))
    if model_dir is not None:
        record_on_card(model_dir, Path(args.model), report)
    from storage.fs import write_text_atomic

    for path, text in ((args.json, to_json(report) if args.json else ""),
                       (args.markdown, to_markdown(report) if args.markdown else "")):
        if path:  # whole or not at all: a script reading the report never finds half of one
            write_text_atomic(path, text)
    return 0


def record_on_card(model_dir: Path, given: Path, report) -> None:
    """Add the scores to the model card of a folder sentsim exported. Not to the new model of an export cut
    between its renames (its trainer may be swapping it in now), and a card that cannot be written is
    said, not fatal: the scores are printed either way."""
    import sys

    from sentsim.training.model_card import record_sts

    if model_dir != given:
        return
    try:
        if record_sts(model_dir, report):
            print(f"model card: {model_dir / 'README.md'} (STS scores recorded)")
    except (OSError, ValueError) as exc:
        print(f"note: {model_dir}: STS scores not recorded on its model card ({type(exc).__name__}: {exc})",
              file=sys.stderr)
