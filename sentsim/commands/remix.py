"""sentsim remix HARVEST --out DIR [--lambda-fwd X ...]"""

from __future__ import annotations

from sentsim.config import add_run_arguments

COMMAND = ("remix",)
HELP = "re-weigh a finished harvest's Eq. 3 terms (or change the Eq. 4 metric) into new pair scores, without re-scoring"


def add_arguments(p) -> None:
    p.add_argument("source", metavar="HARVEST", help="a finished harvest run directory")
    p.add_argument("--out", required=True, help="output run directory (a harvest like any other)")
    for term, what in (("disc", "discriminator"), ("fwd", "forward"), ("left", "left-context"),
                       ("right", "right-context")):
        p.add_argument(f"--lambda-{term}", type=float, metavar="X",
                       help=f"weight of the {what} term (default: the source harvest's)")
    from sentsim.harvest import metrics

    p.add_argument("--metric", choices=metrics.names(),
                   help="Eq. 4 similarity (default: the source's; double-centred: contexts.mode=pool harvests only)")
    p.add_argument("--variant", choices=["paper", "union", "centred"],
                   help="grouped harvests: the Eq. 4 variant that fills score (default: the source's grouping.score)")
    add_run_arguments(p, executor="inline")
    p.add_argument("--address", default=None,
                   help="Ray cluster to attach to with --executor ray (default: RAY_ADDRESS or a local Ray)")


def run(args) -> int:
    from pydantic import ValidationError

    from sentsim.config import run_exit_code
    from sentsim.errors import UsageError
    from sentsim.harvest.remix import TERMS, RemixConfig, remix

    try:
        cfg = RemixConfig(source=args.source, out=args.out, metric=args.metric, variant=args.variant,
                          **{f"lambda_{t}": getattr(args, f"lambda_{t}") for t in TERMS})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UsageError(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None
    m = remix(cfg, force_new=args.force_new, executor=args.executor, address=args.address,
              max_units=args.max_units)
    r = m["remix"]
    lam = ", ".join(f"{t} {r['weights'][t]:g}" for t in TERMS)
    variant = f", Eq. 4 variant {m['config']['remix']['variant']}" if "variant" in m["config"]["remix"] else ""
    print(f"remix: {r['pairs']} pairs ({r['null_scores']} null) from {args.source}, λ {lam}, metric {r['metric']}"
          f"{variant} -> {args.out}")
    if r["approximate"]:
        print(f"  {r['approximate']} pairs approximate: the source predates sentences.context_ids, "
              "so their vectors run "
              "over the contexts both sentences were scored in within their unit")
    if r.get("c_s_chosen_under_source_weights"):
        chosen = ", ".join(f"{t} {r['c_s_weights'][t]:g}" for t in TERMS)
        print(f"  C_s kept as the harvest chose it: Eq. 3 under λ {chosen} re-ranked its "
              f"{r['c_s_chosen_under_source_weights']}-context shortlists (contexts.rerank_shortlist); harvest "
              "again to choose C_s under these λ")
    # each run's value only where it has one (gold labels, and scores that are not all the same)
    gold = [(run, r[f"{run}_spearman_vs_gold"], r.get(f"{run}_gold_pairs", r.get("gold_pairs")))
            for run in ("source", "remix") if f"{run}_spearman_vs_gold" in r]
    if len({n for _, _, n in gold}) == 1:
        print(f"  Spearman x 100 vs gold on {gold[0][2]} pairs: {', '.join(f'{run} {v:.2f}' for run, v, _ in gold)}")
    elif gold:  # a remix stopped by --max-units, or with more null scores than its source: each on its own pairs
        print(f"  Spearman x 100 vs gold: {', '.join(f'{run} {v:.2f} on {n} pairs' for run, v, n in gold)}")
    # a --pairs harvest where a run has none: why, rather than a line that is not there
    why = {run: r[f"{run}_no_gold_spearman"] for run in ("source", "remix") if f"{run}_no_gold_spearman" in r}
    if why:
        said = ([f"no Spearman vs gold: {next(iter(why.values()))}"] if len(set(why.values())) == 1 and len(why) == 2
                else [f"no Spearman vs gold for the {run}: {reason}" for run, reason in why.items()])
        for line in said:
            print("  " + line)
    return run_exit_code(m, args.max_units, args.force_new)
