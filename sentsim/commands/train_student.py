"""`sentsim train student`: RankEncoder, RSE or PaSeR student encoders from harvested shards on Ray Train."""

from __future__ import annotations

from sentsim.config import load_config
from sentsim.students import objectives
from sentsim.training.cli import add_executor, add_training_arguments, backbone_or_default, training_overrides
from sentsim.training.common import counted

COMMAND = ("train", "student")
HELP = f"train a student encoder ({' | '.join(objectives.names())}) from harvested shards"


def add_arguments(parser) -> None:
    parser.add_argument("--objective", choices=objectives.names(), default=None,
                        help=f"{objectives.describe()} (default: the config's objective, {objectives.names()[0]})")
    parser.add_argument("--triples", metavar="FILE", help="rse: JSONL/Parquet of s_i, relation, s_j[, hard_negative]")
    parser.add_argument("--eval-sts", metavar="DIR", help="after training, run the STS suite found under DIR")
    add_executor(parser)
    add_training_arguments(parser, data_help="harvest output: sentences/, pairs/, manifest.json",
                           out_help="output: model/ (sentence-transformers folder), summary.json, curves/, "
                                    "ray/ checkpoints")


def run(args) -> int:
    from sentsim.students import StudentConfig, train_student

    overrides = list(args.overrides)
    readers = objectives.taking("triples")
    if args.triples:
        overrides += [f"{name}.triples={args.triples}" for name in readers]
    cfg = load_config(StudentConfig, args.config, overrides, objective=args.objective, **training_overrides(args))
    if args.triples and not objectives.takes(cfg.objective, "triples"):  # another would train without the file
        from sentsim.errors import UsageError

        raise UsageError(f"--triples is read by --objective {' or '.join(readers)} only, and this run's objective "
                         f"is {cfg.objective}; add --objective {readers[0]}, or leave --triples out")
    s = train_student(cfg, data=args.data, backbone=backbone_or_default(args.backbone), out=args.out,
                      address=args.address, executor=args.executor, force_new=args.force_new, eval_sts=args.eval_sts)
    first, last = s["first_loss"], s["last_loss"]
    fmt = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
    # one logged point (a run shorter than log_every) is the mean over the run, not a start and an end
    loss = f"{fmt(first)} -> {fmt(last)}" if s.get("loss_points", 2) > 1 else f"{fmt(last)} (mean over the run)"
    print(f"{s['objective']}: {counted(s['rows'], 'row')}, {counted(s['total_steps'], 'step')}, loss {loss}; "
          f"model: {s['model']}")
    if s.get("empty_filter_batches") is not None:
        print(f"batches where the pair filter kept no pair (l_cl only): {s['empty_filter_batches']}")
    for k, v in s["skips"].items():
        count, examples = (v.get("count"), v.get("examples") or []) if isinstance(v, dict) else (v, [])
        if count:  # a reason that skipped nothing is no news
            print(f"skipped ({k}): {count}" + (f", e.g. {examples[0]!r}" if examples else ""))
    if s.get("eval"):
        print("STS suite average: " + ", ".join(f"{k} {fmt(v)}" for k, v in s["eval"].items()))
    return 0
