"""The teacher's quality-per-CPU curve (issue 15): Origin on a fixed 300-pair STS-B dev sample.

    python bench/teacher_curve.py --label NAME [--bundle DIR] [--sizes 4,8] [--group 2] [--threads 1]
                                  [--set KEY=VALUE ...]
    python bench/teacher_curve.py --compare LABEL:K:G[:VARIANT] LABEL:K:G[:VARIANT]
    python bench/teacher_curve.py --ensemble LABEL:K:G[:VARIANT] LABEL:K:G[:VARIANT] ... [--against SPEC ...]

One point per |C_s| in --sizes: a real `sentsim harvest --pairs` of the sample with configs/teacher.yaml
(inline, --threads torch threads), timed in CPU-seconds of the harvest process. With --group g > 1 the
harvest scores grouped (sentsim/harvest/grouping.py, g TF-IDF-neighbour pairs per group) and yields three
rows from the same scores: (a) paper, (b) union, (c) centred. Row (a)'s cost is what an ungrouped run
spends: the grouped run's CPU-seconds times (a)'s share of the scored items.

Spearman x 100 against gold with a 95% bootstrap interval (1,000 resamples). Points accumulate in
bench/results/teacher_curve.json (a label run again replaces its points; runs side by side add theirs
under a lock, bench/results/.lock); the table
bench/results/teacher_curve.md and the plot bench/results/teacher_curve.png are redrawn from all of them.
TF-IDF cosine on the same pairs is the baseline row. Runs resume: a cut-off harvest continues.

With --pool, --sizes are pool sizes |P| (contexts.mode=pool, issue 47): every sample sentence is scored
once against one shared pool of |P| corpus windows, and each pair's Eq. 4 compares the two stored
vectors. One harvest per |P| gives a row per metric in --metrics: the first is the harvest's own, the
others are `sentsim remix --metric` of it (no scoring; double-centred removes each pool context's mean
over the sample's sentences). Items and CPU per pair are the harvest's, vectors included.

Each point's per-pair scores go to bench/results/teacher_curve_scores.json as well, so that --compare
still pairs two points after their harvests (in the user cache) are gone; it prefers the harvest. It
also prints their agreement: the Spearman between the two points' pair scores (bf16 against fp32, say).
--ensemble averages several points' standardised pair scores (teachers of other seeds, say) and pairs the
ensemble against each of them and against --against points, from the same kept scores.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import bootstrap, machine, paired_bootstrap, print_paired, pyplot  # noqa: E402

from sentsim.config import unit_count, user_cache  # noqa: E402

STSB_DEV = ROOT.parent / "shared" / "data" / "sts" / "stsbenchmark" / "sts-dev.csv"
RESULTS = ROOT / "bench" / "results"
SAMPLE_SEED, SAMPLE_N = 0, 300
SCORES = "teacher_curve_scores.json"
POOL_VARIANT = "pool-"  # + the Eq. 4 metric: a pool point's variant


def dev_sample(work: Path, n: int = SAMPLE_N) -> Path:
    """The fixed sample: 300 STS-B dev pairs drawn with seed 0 (the same pairs for every point)."""
    from sentsim.pairs_file import read_pairs_file

    pairs = read_pairs_file(str(STSB_DEV))
    pick = sorted(np.random.default_rng(SAMPLE_SEED).choice(len(pairs), size=n, replace=False))
    out = work / f"stsb-dev-{n}.jsonl"
    out.write_text("".join(json.dumps({"s1": pairs[i][0], "s2": pairs[i][1], "gold": pairs[i][2]}) + "\n"
                           for i in pick), encoding="utf-8")
    return out


def cpu_of_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def pairs_committed(run: Path) -> int:
    """Pairs in the units a harvest has committed so far (0 before it starts, or before its first unit)."""
    if not (run / "manifest.json").exists():
        return 0
    from storage.reader import RunReader

    reader = RunReader(str(run))
    if not reader.files("pairs", required=False):  # stopped before its first unit was committed
        return 0
    return reader.read_table("pairs", columns=["pair_id"]).num_rows


def harvest(sample: Path, out: Path, sets: list[str], threads: int, max_units: int | None = None) -> tuple[float, int]:
    """Run the harvest; returns its CPU-seconds and the pairs it scored (0, 0 when already complete).

    A resumed harvest is charged only for the units this process scored, so the cost per pair stays
    right across runs that are cut off and continued. `max_units`: stop after that many units (the
    point is then reported over the units committed so far, and the next run continues it)."""
    if (out / "_COMPLETE").exists():
        return 0.0, 0
    before = pairs_committed(out)
    cmd = [sys.executable, "-m", "sentsim.cli", "harvest", "--config", str(ROOT / "configs" / "teacher.yaml"),
           "--pairs", str(sample), "--out", str(out), "--executor", "inline",
           "--set", f"scoring.torch_threads={threads}", "--set", "pairs_per_unit=20"]
    for s in sets:
        cmd += ["--set", s]
    if max_units is not None:
        cmd += ["--max-units", str(max_units)]
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = cpu_of_children()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if subprocess.call(cmd, cwd=ROOT, env=env) != 0:
        raise SystemExit(f"teacher_curve: harvest into {out} failed; run again to resume")
    return cpu_of_children() - t0, pairs_committed(out) - before


def read_cost(cpu_file: Path, run: Path) -> dict:
    """RUN.cpu: {"cpu_s", "pairs"} summed over the processes that scored. An older file holds only
    the CPU-seconds of the one process that scored every committed unit."""
    if not cpu_file.exists():
        return {}
    text = cpu_file.read_text().strip()
    return json.loads(text) if text.startswith("{") else {"cpu_s": float(text), "pairs": pairs_committed(run)}


def points_of(run: Path, label: str, size: int, group: int, cpu_per_pair: float) -> list[dict]:
    from storage.reader import RunReader

    reader = RunReader(str(run))
    variants = ["paper", "union", "centred"] if group > 1 else ["paper"]
    t = reader.read_table("pairs", numeric=["gold", *(score_column(group, v) for v in variants)]).to_pandas()
    cs = reader.read_table("context_scores", columns=["sentence_id", "context_id", "S"]).to_pandas()
    # a null S: an item Eq. 4 left out unscored (a partner's window holding the sentence), in any run alike
    held = set(zip(cs.sentence_id[cs.S.isna()], cs.context_id[cs.S.isna()]))
    cs = cs[cs.S.notna()]
    sent = reader.read_table("sentences", columns=["sentence_id", "context_ids"]).to_pandas()
    own = dict(zip(sent.sentence_id, (list(x) for x in sent.context_ids)))
    # items an ungrouped run scores: each pair's two sentences against C_s1 + C_s2, once each
    paper_items = {(s, k) for a, b in zip(t.s1_id, t.s2_id) for s in (a, b) for k in own[a] + own[b]} - held
    n, items = len(t), len(cs)
    gold = t.gold.to_numpy(dtype=float)
    out, scores = [], {}
    for v in variants:
        col = score_column(group, v)
        scores[score_key(label, size, group, v)] = [
            [pid, float(sc), float(g)] for pid, sc, g in zip(t.pair_id.tolist(), t[col], gold) if sc == sc]
        rho, lo, hi, used = bootstrap(t[col].to_numpy(dtype=float), gold)
        share = len(paper_items) / items if v == "paper" else 1.0
        ctx = np.mean([len(own[a]) + len(own[b]) for a, b in zip(t.s1_id, t.s2_id)])
        if v != "paper":  # the group's union
            groups = t.groupby("group_id")
            ctx = np.mean([len({k for s in set(g.s1_id) | set(g.s2_id) for k in own[s]})
                           for _, g in groups for _ in range(len(g))])
        out.append({"label": label, "size": size, "group": group if v != "paper" else 1, "variant": v,
                    "spearman": rho, "lo": lo, "hi": hi, "pairs": used, "of": n,
                    "contexts_per_pair": float(ctx), "items_per_pair": items * share / n,
                    "cpu_s_per_pair": cpu_per_pair * share if cpu_per_pair else None})
    return out, scores


def pool_points_of(labels: Path, harvest_run: Path, label: str, size: int, metric: str,
                   cpu_per_pair: float) -> tuple[list[dict], dict]:
    """The row of a pool harvest's pairs (in `labels`: the harvest itself or a remix of it to `metric`):
    each pair compares its sentences' vectors over all |P| = `size` contexts; items are the vectors run's
    (sentences x |P|) over the pairs labelled, from the harvest's report."""
    from storage.reader import RunReader

    t = RunReader(str(labels)).read_table("pairs", ["pair_id", "score", "gold"], numeric=["score", "gold"]).to_pandas()
    report = json.loads((harvest_run / "report.json").read_text())
    variant = POOL_VARIANT + metric
    rho, lo, hi, used = bootstrap(t.score.to_numpy(dtype=float), t.gold.to_numpy(dtype=float))
    point = {"label": label, "size": size, "group": 1, "variant": variant, "spearman": rho, "lo": lo, "hi": hi,
             "pairs": used, "of": len(t), "contexts_per_pair": float(size),
             "items_per_pair": report["scored_items_per_pair"], "cpu_s_per_pair": cpu_per_pair or None}
    scores = {score_key(label, size, 1, variant): [[pid, float(sc), float(g)] for pid, sc, g in
                                                   zip(t.pair_id.tolist(), t.score, t.gold) if sc == sc]}
    return [point], scores


def pool_run(work: Path, label: str, n: int, size, metric: str | None = None) -> Path:
    """Where a pool point's harvest is (metric None), and where its remix to `metric` goes."""
    base = work / f"{label}-n{n}-p{size}"
    return base if metric is None else base.with_name(f"{base.name}-{metric}")


def pool_labels(work: Path, label: str, n: int, size, metric: str) -> Path | None:
    """The run holding a pool point's pair scores by `metric`: its remix, or the harvest scored with it."""
    from storage.reader import RunReader

    for run in (pool_run(work, label, n, size, metric), pool_run(work, label, n, size)):
        if (run / "_COMPLETE").exists() and RunReader(str(run)).manifest["config"].get("metric") == metric:
            return run
    return None


def remix_metric(harvest_run: Path, out: Path, metric: str) -> None:
    """`sentsim remix --metric`: the same vectors, another Eq. 4 (nothing is scored)."""
    if (out / "_COMPLETE").exists():
        return
    cmd = [sys.executable, "-m", "sentsim.cli", "remix", str(harvest_run), "--out", str(out), "--metric", metric,
           "--executor", "inline"]
    print("$", " ".join(cmd[2:]), flush=True)
    if subprocess.call(cmd, cwd=ROOT) != 0:
        raise SystemExit(f"teacher_curve: remix of {harvest_run} into {out} failed")


def score_column(group, variant: str) -> str:
    """The pairs column of a variant's Eq. 4: `score` ungrouped, `score_<variant>` in a grouped harvest."""
    return "score" if int(group) <= 1 else f"score_{variant}"


def load_scores(results: Path) -> dict:
    """The per-pair scores kept for every point, by score_key (empty before the first point)."""
    f = results / SCORES
    return json.loads(f.read_text()) if f.is_file() else {}


@contextlib.contextmanager
def results_locked(results: Path):
    """Hold results/.lock while reading and rewriting the json files: two runs of this script side by
    side (one thread each, as the curve is measured) each add their points without dropping the other's."""
    with open(results / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    """Write beside, then rename: a reader (or a kill) never meets half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def add_points(results: Path, label: str, size: int, group: int, new: list[dict], scores: dict) -> None:
    """Add one harvest's points and per-pair scores to the results, replacing that label's earlier
    points at this size (its paper row, and its grouped rows of this group size; a pool harvest: its
    rows of the same metrics)."""
    store = results / "teacher_curve.json"
    pooled = {p["variant"] for p in new if p["variant"].startswith(POOL_VARIANT)}

    def replaced(p: dict) -> bool:
        if p["label"] != label or p["size"] != size:
            return False
        if p["variant"].startswith(POOL_VARIANT) or pooled:
            return p["variant"] in pooled
        return p["variant"] == "paper" or p["group"] == group

    with results_locked(results):
        write_atomic(results / SCORES, json.dumps({**load_scores(results), **scores}, sort_keys=True) + "\n")
        # read under the lock: another run of this script may have added its points while this harvest ran
        points = json.loads(store.read_text()) if store.exists() else []
        keep = [p for p in points if not replaced(p)]
        write_atomic(store, json.dumps(keep + new, indent=1))


def score_key(label: str, size, group, variant: str) -> str:
    """LABEL:K:G:VARIANT, G being the harvest's group size (a grouped run's paper row included)."""
    return f"{label}:{size}:{group}:{variant}"


def point_scores(work: Path, n: int, spec: str, results: Path, flag: str):
    """One point's pair scores as a frame (pair_id -> spec, gold): from its harvest where it is still on
    disk, else from the per-pair scores kept in the results."""
    import pandas as pd

    from sentsim.harvest import metrics
    from storage.reader import RunReader

    label, k, g, *variant = spec.split(":") + [""] * 2
    pool_metric = variant[0][len(POOL_VARIANT):] if variant[0].startswith(POOL_VARIANT) else None
    if not (label and k.isdigit() and g.isdigit() and not any(variant[1:])
            and (variant[0] in ("", "paper", "union", "centred") or (pool_metric in metrics.names() and g == "1"))):
        raise SystemExit(f"teacher_curve: {flag} {spec!r}: expected LABEL:K:G[:paper|union|centred], "
                         f"or LABEL:P:1:{POOL_VARIANT}METRIC for a pool point")
    run = work / f"{label}-n{n}-k{k}-g{g}"
    if pool_metric:  # None when no finished run holds that metric's scores: then the kept ones
        run = pool_labels(work, label, n, k, pool_metric)
    v = variant[0] or "paper"
    key = score_key(label, k, g, v)
    stored = load_scores(results)
    if run is not None and run.is_dir():
        col = "score" if pool_metric else score_column(g, v)
        t = RunReader(str(run)).read_table("pairs", ["pair_id", col, "gold"], numeric=[col, "gold"]).to_pandas()
        t = t.rename(columns={col: spec})
    elif key in stored:
        t = pd.DataFrame(stored[key], columns=["pair_id", spec, "gold"])
    else:
        raise SystemExit(f"teacher_curve: {flag} {spec!r}: no harvest at {run} and no scores for {key} "
                         f"in {results / SCORES}")
    return t.set_index("pair_id")


def compare(work: Path, n: int, first: str, second: str, results: Path) -> int:
    """Print the paired bootstrap of two points' Spearman difference over the pairs both scored, and
    the Spearman between their pair scores (their agreement)."""
    cols = [point_scores(work, n, spec, results, "--compare") for spec in (first, second)]
    both = cols[0].join(cols[1][[second]], how="inner").dropna()
    print_paired(first, second, *(both[c].to_numpy(dtype=float) for c in (first, second, "gold")))
    return 0


def ensemble(work: Path, n: int, members: list[str], against: list[str], results: Path) -> int:
    """Score-level ensemble of several points: each member's pair scores standardised (Eq. 4 scores of
    different teachers sit in different narrow bands) and averaged, over the pairs every point scored.
    Prints its Spearman with a bootstrap interval, then the paired difference against each member and
    each --against point (e.g. one teacher at the |C_s| that spends the ensemble's items)."""
    if len(members) < 2:
        raise SystemExit("teacher_curve: --ensemble needs two points or more")
    frames = [point_scores(work, n, spec, results, "--ensemble") for spec in members + against]
    table = frames[0]
    for spec, f in zip(members[1:] + against, frames[1:]):
        table = table.join(f[[spec]], how="inner")
    table = table.dropna()
    gold = table["gold"].to_numpy(dtype=float)
    z = [(table[m] - table[m].mean()) / table[m].std() for m in members]
    mix = np.mean([x.to_numpy(dtype=float) for x in z], axis=0)
    rho, lo, hi, used = bootstrap(mix, gold)
    print(f"ensemble of {' + '.join(members)} on {used} pairs all scored: {rho:.2f} [{lo:.1f}, {hi:.1f}] "
          "(Spearman x 100, 95% bootstrap)")
    for spec in members + against:
        d, dlo, dhi = paired_bootstrap(mix, table[spec].to_numpy(dtype=float), gold)
        print(f"  ensemble - {spec}: {d:+.2f} [{dlo:+.1f}, {dhi:+.1f}]")
    return 0


def tfidf_point(sample: Path) -> dict:
    from types import SimpleNamespace

    from sentsim.evaluation import TfidfScorer

    rows = [json.loads(line) for line in sample.read_text().splitlines()]
    s1, s2 = [r["s1"] for r in rows], [r["s2"] for r in rows]
    tf = TfidfScorer()
    tf.begin_task(SimpleNamespace(sets=[SimpleNamespace(s1=s1, s2=s2)]))
    rho, lo, hi, n = bootstrap(np.asarray(tf.score_pairs(s1, s2)), np.array([r["gold"] for r in rows]))
    return {"label": "TF-IDF cosine", "spearman": rho, "lo": lo, "hi": hi, "pairs": n, "of": len(rows)}


def redraw(points: list[dict], baseline: dict, results: Path, n: int) -> None:
    lines = [f"Machine: {machine()}", "",
             f"Fixed sample: {n} STS-B dev pairs (seed {SAMPLE_SEED}). Spearman x 100 [95% bootstrap "
             "interval]; CPU-s per pair of the harvest process (inline, torch threads as given).", "",
             f"Baseline, TF-IDF cosine on the same pairs: **{baseline['spearman']:.2f}** "
             f"[{baseline['lo']:.1f}, {baseline['hi']:.1f}]", "",
             "| teacher | \\|C_s\\| (pool: \\|P\\|) | Eq. 4 variant | contexts per pair | items per pair "
             "| CPU-s per pair | Spearman x 100 | 95% interval | pairs scored |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|"]
    for p in points:
        cpu = f"{p['cpu_s_per_pair']:.2f}" if p.get("cpu_s_per_pair") else "-"
        name = {"paper": "(a) paper", "union": f"(b) union, g={p['group']}",
                "centred": f"(c) centred, g={p['group']}"}.get(
            p["variant"], f"pool, {p['variant'][len(POOL_VARIANT):]}")
        lines.append(f"| {p['label']} | {p['size']} | {name} | {p['contexts_per_pair']:.1f} | "
                     f"{p['items_per_pair']:.1f} | {cpu} | {p['spearman']:.2f} | [{p['lo']:.1f}, {p['hi']:.1f}] | "
                     f"{p['pairs']}/{p['of']} |")
    if any(p["of"] < n for p in points):
        lines += ["", f"Rows with fewer than {n} pairs come from harvests stopped early (`--partial`): their first "
                  "units, in sample order; their CPU-seconds were read from the process before it was stopped."]
    write_atomic(results / "teacher_curve.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    plt = pyplot("teacher_curve")
    if plt is None:
        return
    # one colour per teacher, its (a) points joined in |C_s| order; marker shape = Eq. 4 variant
    fig, ax = plt.subplots(figsize=(9, 5.5))
    markers = {"paper": "o", "union": "s", "centred": "^"}
    names = {"paper": "(a) paper, C_s1 + C_s2", "union": "(b) group union", "centred": "(c) union, group-centred"}
    for v in sorted({p["variant"] for p in points if p["variant"].startswith(POOL_VARIANT)}):
        markers[v] = "D" if v.endswith("pearson") else "v"
        names[v] = f"shared pool P, {v[len(POOL_VARIANT):]} (numbers: |P|)"
    labels = sorted({p["label"] for p in points if p.get("cpu_s_per_pair")})
    colours = plt.get_cmap("tab20" if len(labels) > 10 else "tab10")
    for i, label in enumerate(labels):
        # tab20 lists each hue dark then light: the dark ones first, so neighbours stay apart
        colour = colours((2 * i) % 20 + (2 * i) // 20 if colours.N == 20 else i % colours.N)
        for v in markers:
            ps = sorted((p for p in points if p["label"] == label and p["variant"] == v and p.get("cpu_s_per_pair")),
                        key=lambda p: p["size"])
            if not ps:
                continue
            x = [p["cpu_s_per_pair"] for p in ps]
            y = [p["spearman"] for p in ps]
            err = [[p["spearman"] - p["lo"] for p in ps], [p["hi"] - p["spearman"] for p in ps]]
            # a line over |C_s| (solid) or |P| (dotted); a grouped variant's points stand alone
            joined = len(ps) > 1 and v not in ("union", "centred")
            ax.errorbar(x, y, yerr=err, fmt=markers[v], color=colour, capsize=2, elinewidth=0.8, alpha=0.9,
                        ls=("-" if v == "paper" else ":") if joined else "none", lw=1,
                        label=label if v == "paper" else None)
            for p, xi, yi in zip(ps, x, y):
                ax.annotate(f"{p['size']}", (xi, yi), fontsize=7, color=colour, xytext=(4, 2),
                            textcoords="offset points")
    for v in [m for m in markers if m != "paper"]:  # the variant legend: marker shapes in black
        if any(p["variant"] == v for p in points):
            ax.plot([], [], markers[v], color="black", label=names[v])
    ax.axhline(baseline["spearman"], color="grey", ls="--", lw=1, label="TF-IDF cosine (same pairs)")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter  # plain numbers (3, 4, 6, 10, 20), not 3 x 10^0

    for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
        axis(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "123456" else ""))
    ax.set_xlabel("CPU-seconds per pair (harvest process)")
    ax.set_ylabel(f"STS-B dev Spearman x 100 ({n} pairs)")
    ax.set_title("Origin teacher: quality against CPU per pair (numbers: |C_s|; lines: (a) over |C_s|)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(results / "teacher_curve.png", dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", help="name of this teacher in the table (e.g. tokens-150000); needed to score")
    ap.add_argument("--bundle", default=None, help="context-model bundle (default: the one configs/teacher.yaml names)")
    ap.add_argument("--sizes", default="4,8", help="|C_s| values, comma-separated")
    ap.add_argument("--group", type=int, default=None, help="pairs per group; 1 = ungrouped (default 2; 1 with --pool)")
    ap.add_argument("--pool", action="store_true",
                    help="--sizes are pool sizes |P|: each sentence scored once against one shared pool of contexts")
    ap.add_argument("--metrics", default="pearson,double-centred",
                    help="with --pool: the Eq. 4 metrics, a row each (the first scores, the others remix)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default=None, help="where the harvests go (default: SENTSIM_CACHE/curve)")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--redraw", action="store_true", help="only redraw the table and plot from the stored points")
    ap.add_argument("--pairs", type=int, default=SAMPLE_N, help="sample size (300; fewer for a smoke run)")
    ap.add_argument("--results", default=str(RESULTS), help="folder of the json, md and png")
    ap.add_argument("--compare", nargs=2, metavar="LABEL:K:G[:VARIANT]",
                    help="paired bootstrap of two points' difference on the pairs both scored, e.g. "
                         "mixed-150K:8:1 mixed-150K:4:1 (VARIANT paper/union/centred for a grouped run)")
    ap.add_argument("--ensemble", nargs="+", metavar="LABEL:K:G[:VARIANT]",
                    help="average two or more points' standardised pair scores (a score-level ensemble of "
                         "teachers) and compare it with each of them on the pairs all scored")
    ap.add_argument("--against", nargs="+", default=[], metavar="LABEL:K:G[:VARIANT]",
                    help="with --ensemble: more points to compare the ensemble with (e.g. one teacher at 2x |C_s|)")
    ap.add_argument("--max-units", type=unit_count, default=None, metavar="N",  # 0 refused, as by the CLI
                    help="score at most N more units (20 pairs each) of each harvest, then report the point over "
                         "what is committed; run again to continue (a long point split across sessions)")
    ap.add_argument("--partial", action="store_true",
                    help="report the committed units of harvests stopped early, without running them")
    args = ap.parse_args(argv)
    if not (args.label or args.redraw or args.compare or args.ensemble):
        ap.error("--label is needed to score a point (or give --redraw, --compare or --ensemble)")
    if args.against and not args.ensemble:
        ap.error("--against goes with --ensemble")
    if args.group is None:
        args.group = 1 if args.pool else 2
    if args.pool and args.group != 1:
        ap.error("--pool labels each pair from its sentences' vectors over the whole pool: no --group")
    from sentsim.harvest import metrics

    pool_metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if args.pool and (not pool_metrics or any(m not in metrics.names() for m in pool_metrics)):
        ap.error(f"--metrics: a comma-separated list of {', '.join(metrics.names())}")
    work = Path(args.work or user_cache() / "curve")
    work.mkdir(parents=True, exist_ok=True)
    sample = dev_sample(work, args.pairs)
    results = Path(args.results)
    if args.compare:
        return compare(work, args.pairs, *args.compare, results)
    if args.ensemble:
        return ensemble(work, args.pairs, args.ensemble, args.against, results)
    results.mkdir(parents=True, exist_ok=True)
    store = results / "teacher_curve.json"
    if not args.redraw:
        for k in (int(x) for x in args.sizes.split(",")):
            if args.pool:
                sets = ["contexts.mode=pool", f"contexts.pool_size={k}", f"metric={pool_metrics[0]}", *args.sets]
                run = pool_run(work, args.label, args.pairs, k)
            else:
                sets = [f"contexts.size={k}", *args.sets]
                run = work / f"{args.label}-n{args.pairs}-k{k}-g{args.group}"
            if args.bundle:
                sets.append(f"context_models=[{Path(args.bundle).resolve()}]")
            if args.group > 1:
                sets += ["grouping.enabled=true", f"grouping.pairs_per_group={args.group}"]
            cpu_file = run.with_suffix(".cpu")
            # --partial: a harvest stopped early (its CPU-seconds written to RUN.cpu beforehand) is
            # reported over the units it committed
            cpu, scored = (0.0, 0) if args.partial else harvest(sample, run, sets, args.threads, args.max_units)
            cost = read_cost(cpu_file, run)
            if scored:  # CPU-seconds and pairs add up over the runs of a resumed harvest
                cost = {"cpu_s": cost.get("cpu_s", 0.0) + cpu, "pairs": cost.get("pairs", 0) + scored}
                cpu_file.write_text(json.dumps(cost))
            cpu_per_pair = cost.get("cpu_s", 0.0) / max(cost.get("pairs", 0), 1)
            if not args.pool:
                new, scores = points_of(run, args.label, k, args.group, cpu_per_pair)
                add_points(results, args.label, k, args.group, new, scores)
                continue
            if not (run / "_COMPLETE").exists():
                raise SystemExit(f"teacher_curve: the pool harvest {run} is not finished; run again to go on "
                                 "(a pool point is reported whole)")
            new, scores = [], {}
            for metric in pool_metrics:
                if metric != pool_metrics[0]:
                    remix_metric(run, pool_run(work, args.label, args.pairs, k, metric), metric)
                rows, kept = pool_points_of(pool_labels(work, args.label, args.pairs, k, metric), run, args.label,
                                            k, metric, cpu_per_pair)
                new, scores = new + rows, {**scores, **kept}
            add_points(results, args.label, k, 1, new, scores)
    baseline = tfidf_point(sample)
    with results_locked(results):  # the table and plot from every point written so far, this run's or another's
        points = json.loads(store.read_text()) if store.exists() else []
        points.sort(key=lambda p: (p["label"], p["variant"] != "paper", p["size"]))
        redraw(points, baseline, results, args.pairs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
