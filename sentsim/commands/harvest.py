"""sentsim harvest --config FILE"""

from __future__ import annotations

from sentsim.config import add_config_arguments, add_run_arguments

COMMAND = ("harvest",)
HELP = "harvest pair similarities (Eq. 4) and rank-vector targets into resumable Parquet shards"


def add_arguments(p) -> None:
    p.add_argument("--corpus", metavar="DIR", help="corpus run directory (sentences/, chunks/)")
    p.add_argument("--index", metavar="DIR", help="retrieval index directory")
    p.add_argument("--discriminator", metavar="DIR",
                   help="discriminator directory: screens the retrieved contexts and scores Eq. 3's disc term "
                        "(contexts.mode=screened only)")
    p.add_argument("--context-models", metavar="DIR", nargs="+", help="context-model bundle folder(s)")
    p.add_argument("--pairs", dest="pairs_file", metavar="FILE",
                   help="explicit mode: score these pairs instead of sampling")
    p.add_argument("--out", metavar="DIR",
                   help="output run directory (local path or s3://...); an existing run there with the same "
                        "fingerprint is resumed, another is refused unless --force-new")
    add_run_arguments(p, passes="the rep cache a harvest with --discriminator builds first is one; a pool harvest's "
                               "vectors, rank targets and labels are three")
    add_config_arguments(p)


def run(args) -> int:
    from sentsim.config import load_config, run_exit_code
    from sentsim.harvest.config import HarvestConfig
    from sentsim.harvest.job import harvest

    cfg = load_config(
        HarvestConfig, args.config, args.overrides, flags={"corpus": "--corpus", "out": "--out"},
        corpus=args.corpus, index=args.index,
        discriminator=args.discriminator, context_models=args.context_models, pairs_file=args.pairs_file, out=args.out,
    )
    m = harvest(cfg, executor=args.executor, force_new=args.force_new, address=args.address,
                max_units=args.max_units)
    import json

    from storage import fs as sfs

    fs, root = sfs.resolve(cfg.out)  # local or s3://: the report lies where the run does
    rep = json.loads(sfs.read_bytes(fs, sfs.join(root, "report.json")))
    print(f"harvest: {rep.get('pairs', '?')} pairs ({rep.get('null_scores', '?')} null) in "
          f"{m['completed_units']}/{m['planned_units']} units -> {cfg.out}")
    if rep.get("null_reasons"):  # why a pair has no score: a surrogate trains only on the scored ones
        print("  null scores: " + "; ".join(f"{n} {reason}" for reason, n in rep["null_reasons"].items()))
    if rep and not rep.get("pairs"):  # stopped (--max-units) before any unit of pairs was labelled, or none had any
        if rep.get("complete"):
            # a run with nothing to train on is a failure a script must see; its cause is the input or the
            # config, so the run stays complete and a rerun says the same without redoing anything
            from sentsim.errors import UsageError

            raise UsageError(f"--out {cfg.out}: the harvest " + unlabelled_line(rep, m) + "; change the inputs or "
                             "the partners.* settings and run again with --force-new (or another --out)")
        print("  " + unlabelled_line(rep, m))
    elif rep:
        print("  score by split: " + ", ".join(
            f"{s} n={v['n']}" + (f" mean={v['mean']:.3f}" if v["n"] else "")
            + (f" sd={v['std']:.4f}" if v["n"] > 1 else "") for s, v in rep["score"].items()))
        train = rep["score"].get("train", {})
        if train.get("n", 0) > 1:  # said at the harvest, before anyone trains on it
            from sentsim.losses.cosine_regression import narrow_targets_warning

            line = narrow_targets_warning(train["mean"], train["std"], "the train scores",
                                          "train surrogates with --loss cosent, which learns their order")
            if line:
                print("  " + line)
        if rep.get("spearman_score_vs_rank_sim") is not None:  # None: rank targets off, or too few pairs
            print(f"  spearman(score, rank_sim) = {rep['spearman_score_vs_rank_sim']:.4f}")
        if "rerank_items" in rep:  # contexts.rerank_shortlist: what choosing C_s by Eq. 3 cost
            print(f"  C_s: Eq. 3's top {cfg.contexts.size} of {cfg.contexts.rerank_shortlist}-context shortlists; "
                  f"{rep['rerank_items']:,} of the {rep['scored_items']:,} items scored chose them")
        if rep.get("placement"):
            from sentsim.harvest.report import placement_line

            print("  units per node: " + placement_line(rep["placement"]))
    return run_exit_code(m, args.max_units, args.force_new)


def unlabelled_line(rep: dict, manifest: dict) -> str:
    """What a harvest with no pair labelled has done: its units, and a pool harvest's vectors, which every unit
    of pairs waits for. A finished one says so, and, for a corpus harvest, that no anchor got a partner (its
    partner settings, and that neighbours need an --index) rather than that labelling is still to come."""
    units, vectors = rep.get("units") or {}, rep.get("vectors_units")
    done = f"{units.get('completed') or 0} of {units.get('planned') or '?'} units done"
    if rep.get("complete"):
        return f"finished with no pairs labelled ({done}){unpaired_anchors(manifest)}"
    if vectors and vectors.get("completed") != vectors.get("planned"):
        return (f"no pairs labelled yet: the pool's sentence vectors are {vectors.get('completed')} of "
                f"{vectors.get('planned')} units done, and labelling ({done}) waits for all of them")
    return f"no pairs labelled yet: {done}"


def unpaired_anchors(manifest: dict) -> str:
    """Why a finished corpus harvest has no pair: none of its anchors got a partner (nothing to say for a --pairs
    or pool harvest, whose planned pairs are each labelled)."""
    cfg, anchors = manifest.get("config") or {}, (manifest.get("plan") or {}).get("anchors")
    if anchors is None or (cfg.get("contexts") or {}).get("mode") == "pool":
        return ""
    p = cfg.get("partners") or {}
    index = "" if cfg.get("index") or not p.get("neighbours") else \
        "; neighbours are drawn from --index, and none was given"
    return (f": none of the {anchors} anchors got a partner (partners.neighbours={p.get('neighbours')}, "
            f"same_doc={p.get('same_doc')}, random={p.get('random')}{index})")
