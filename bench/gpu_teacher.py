"""The one-run teacher's CPU side (`bench/gpu.py --teacher-minutes`): its pair sets, their context sets, the
per-pair score files it writes and the tables made from them.

    python bench/gpu_teacher.py contexts --corpus DIR --out DIR --set NAME=FILE [--set ...] [--size 100]
        [--index DIR] [--workers N] [--limit N]
    python bench/gpu_teacher.py report DIR          # the teacher's tables again, on a CPU, from DIR's score files

Pair sets: STS-B test (all of it), the 300-pair STS-B dev sample, and any pairs file (`--pairs`, every format
`sentsim harvest --pairs` reads), named by its stem, or where that is another's or a built-in set's name, by
more of its path (`set_names`: pairs.csv and pairs.tsv are pairs_csv and pairs_tsv). A set that cannot be
read is not made and is listed under "failed" in contexts-kSIZE.json; the others are. Context sets are made
as the harvest makes them (`ContextStage`: configs/teacher.yaml's screening, TF-IDF bigram retrieval over the
corpus's own index, windows of the context model's `context_sentences` each side), without Ray: the index is
built in this process and units go to forked worker processes. Only the largest |C_s| is made; a smaller one
is its prefix, because selection is greedy in retrieval order (tests/evaluation/test_bench_gpu.py checks this
against `ContextStage` at the smaller size).

Score files: `teacher-NAME.jsonl.gz`, one JSON object a pair: s1, s2, gold, tfidf, and per |C_s| label K
`score_K` (Eq. 4, null where the pair has none), `null_K` (why) and `ctx_K` (contexts of s1 and s2). A label
is K (the screening's first K contexts) or K/N (K chosen by Eq. 3 from the first N: `parse_size`).
TF-IDF cosine is BENCHMARKS.md's baseline (bench/teacher_test.py, bench/teacher_curve.py): sklearn's
TfidfVectorizer (lowercase, sublinear tf, unigrams) with its IDF fitted on the unique sentences of the whole
set (`sentsim.evaluation.TfidfScorer`), cosine of the two sentences' vectors. Spearman x 100 with 95%
bootstrap intervals (1,000 resamples) and the paired difference Origin - TF-IDF (2,000 resamples) are
bench/common.py's, over the pairs Origin scored, as bench/teacher_test.py reports them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PAIRS_PER_UNIT = 20  # as bench/teacher_gpu.py exports and bench/teacher_curve.py harvests
GPU_DATA = ROOT / ".gpu" / "data"  # what bench/gpu_prep.sh copies from ../shared/gpu, carried to a GPU machine
SHARED = ROOT.parent / "shared"
STSB_TEST = [GPU_DATA / "sts-test.csv", SHARED / "data" / "sts" / "stsbenchmark" / "sts-test.csv"]
DEV_SAMPLE = [GPU_DATA / "contexts" / "stsb-dev-300.jsonl", SHARED / "gpu" / "data" / "contexts" / "stsb-dev-300.jsonl"]
MODEL_CONFIG = ROOT / "configs" / "gpu_context.yaml"


def first_file(candidates: list[Path]) -> str:
    """The first of the places a file is looked for that holds it ('' where none does)."""
    return next((str(p) for p in candidates if p.is_file()), "")


BUILT_IN_SETS = ("stsb_test", "dev")


def _key(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def set_name(path: str, level: int = 0) -> str:
    """A pairs file's name as a key of the results, other characters than [A-Za-z0-9_-] as '_': at level 0 its
    stem (`pairs`), at 1 its whole name (`pairs_jsonl_gz`), at 2 and above that many folders above it too
    (`a_test_tsv`), so that the name that tells files apart is the shortest that does."""
    name = Path(path).name
    if level == 0:
        return _key(name.split(".")[0]) or "pairs"
    parts = Path(os.path.abspath(path)).parts[1:]  # the root's "/" would name nothing
    return _key("_".join(parts[-level:] if level > 1 else [name]))


def set_names(paths: list[str], taken=BUILT_IN_SETS) -> list[str]:
    """A name for each pairs file (`set_name`) that no other file's name and no built-in set's is: a file
    whose name clashes is named at the next level, until none does. Stable: a file's name depends on the
    files given with it, never on their order (but for files whose names differ only in characters that
    both become '_', told apart by a number)."""
    levels = [0] * len(paths)
    deepest = [len(Path(os.path.abspath(p)).parts) - 1 for p in paths]
    while True:
        names = [set_name(p, lv) for p, lv in zip(paths, levels)]
        clash = [i for i, n in enumerate(names)
                 if (names.count(n) > 1 or n in taken) and levels[i] < deepest[i]]
        if not clash:
            break
        for i in clash:
            levels[i] += 1
    seen = set(taken)
    for i, n in enumerate(names):
        k, name = 1, n
        while name in seen:
            k += 1
            name = f"{n}_{k}"
        names[i] = name
        seen.add(name)
    return names


def one_line(exc: BaseException) -> str:
    """An error as one line: its type and message, the message's lines joined."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def read_set(path: str, limit: int = 0) -> list[tuple]:
    """(s1, s2, gold) of a pairs file, those with a gold score, the first `limit` of them when given."""
    from sentsim.errors import InputError
    from sentsim.pairs_file import read_pairs_file

    pairs = [(a, b, float(g)) for a, b, g in read_pairs_file(path) if g is not None]
    if not pairs:
        raise InputError(f"{path}: no pair has a gold score, so there is nothing to correlate with")
    return pairs[:limit] if limit else pairs


def tfidf_cosine(pairs: list[tuple]) -> np.ndarray:
    """TF-IDF cosine of each pair, IDF fitted on the unique sentences of all the pairs given."""
    from types import SimpleNamespace

    from sentsim.evaluation import TfidfScorer

    s1, s2 = [p[0] for p in pairs], [p[1] for p in pairs]
    tf = TfidfScorer()
    tf.begin_task(SimpleNamespace(sets=[SimpleNamespace(s1=s1, s2=s2)]))
    return np.asarray(tf.score_pairs(s1, s2), dtype=float)


# ---------------------------------------------------------------------------------------------- context sets

def harvest_config(corpus: str, index: str, size: int):
    """configs/teacher.yaml's context selection on this corpus and index at |C_s| = `size`."""
    from sentsim.config import load_config
    from sentsim.harvest.config import HarvestConfig

    return load_config(HarvestConfig, str(ROOT / "configs" / "teacher.yaml"),
                       [f"contexts.size={size}", f"pairs_per_unit={PAIRS_PER_UNIT}"], corpus=corpus, index=index,
                       pairs_file="unused", out="unused", context_models=["unused"])


def context_window() -> int:
    """Context sentences on each side: those of the model the sets are scored with (configs/gpu_context.yaml)."""
    import yaml

    return int(yaml.safe_load(MODEL_CONFIG.read_text())["model"].get("context_sentences", 1))


def ensure_index(corpus: str, index: str) -> float:
    """The corpus's TF-IDF bigram index (sentsim's defaults, as `sentsim index build`) at `index`, built
    in this process where it is not there yet; the seconds it took."""
    from sentsim.retrieval import IndexConfig, build_index
    from sentsim.retrieval.index_store import INDEX_MANIFEST

    if (Path(index) / INDEX_MANIFEST).exists():
        return 0.0
    t0 = time.perf_counter()
    build_index(corpus, index, IndexConfig(), workers=1)
    return time.perf_counter() - t0


_STAGE = None  # the ContextStage of this process: set before the workers fork, so they share its pages


def _unit_line(item: dict) -> str:
    """One unit, selected, as a JSON line of bench/teacher_gpu.py export's format."""
    from teacher_gpu import unit_line

    return unit_line(_STAGE.process([item])[0])


def make_contexts(corpus: str, index: str, sets: dict, size: int, out: Path, workers: int = 1) -> dict:
    """`NAME-kSIZE.jsonl.gz` in `out` for each named list of pairs: its units of 20 pairs with every sentence's
    context set. Returns seconds and counts, by set, and under "failed" the sets not made, each with its
    error in one line."""
    import multiprocessing as mp

    from sentsim.harvest.stages import ContextStage

    global _STAGE
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _STAGE = ContextStage(harvest_config(corpus, index, size), context_window())
    _STAGE.setup()
    info = {"load_s": time.perf_counter() - t0, "sets": {}, "failed": {}}
    pool = mp.get_context("fork").Pool(workers) if workers > 1 else None
    try:
        for name, pairs in sets.items():
            t1 = time.perf_counter()
            items = [{"unit": u // PAIRS_PER_UNIT, "pairs": [tuple(p) for p in pairs[u:u + PAIRS_PER_UNIT]]}
                     for u in range(0, len(pairs), PAIRS_PER_UNIT)]
            try:
                lines = list(pool.imap(_unit_line, items)) if pool else [_unit_line(i) for i in items]
            except Exception as exc:  # noqa: BLE001 - one set's failure leaves the others' context sets
                info["failed"][name] = one_line(exc)
                print(f"contexts {name}: not made: {info['failed'][name]}", flush=True)
                continue
            dst = out / f"{name}-k{size}.jsonl.gz"
            tmp = dst.with_suffix(".tmp")
            with gzip.open(tmp, "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            os.replace(tmp, dst)
            info["sets"][name] = {"pairs": len(pairs), "units": len(items), "seconds": time.perf_counter() - t1,
                                  "bytes": dst.stat().st_size}
            print(f"contexts {name}, |C_s| = {size}: {len(pairs)} pairs in {info['sets'][name]['seconds']:.1f} s "
                  f"({workers} process(es)) -> {dst}", flush=True)
    finally:
        if pool:
            pool.close()
            pool.join()
    return info


def parse_size(label: str) -> tuple[int, int]:
    """A --teacher-sizes entry as (K, N): "K" is |C_s| = K, the screening's first K contexts (N = 0); "K/N" is
    |C_s| = K chosen by Eq. 3 from the screening's first N (the harvest's contexts.rerank_shortlist, 003 §3.3)."""
    k, _, n = str(label).partition("/")
    try:
        size, shortlist = int(k), int(n or 0)
    except ValueError:
        raise ValueError(f"|C_s| {label!r}: expected K or K/N (K chosen by Eq. 3 from N)") from None
    if size < 1 or (n and shortlist <= size):
        raise ValueError(f"|C_s| {label!r}: K must be 1 or more, and N above K")
    return size, shortlist


def contexts_needed(labels) -> int:
    """The screening's longest set that the sizes read: the largest K or N."""
    return max(max(parse_size(x)) for x in labels)


def read_units(path: Path, size: int, shortlist: int = 0) -> list[dict]:
    """The units of a context file, each context set cut to its first `size` contexts: the set that
    selection at |C_s| = `size` makes (greedy in retrieval order), its shortfall stated as ContextStage does.
    With a `shortlist` (above `size`), cut to that many instead, for ScoreStage to re-rank to `size`; the
    shortfall is still against `size`."""
    units = [json.loads(x) for x in gzip.open(path, "rt", encoding="utf-8").read().splitlines() if x]
    for u in units:
        for cs in u["csets"].values():
            have = cs["contexts"]
            if len(have) >= size:
                cs["contexts"], cs["shortfall_reason"] = have[:max(size, shortlist)], None
            elif have:
                cs["shortfall_reason"] = f"only {len(have)} diverse contexts among {cs['candidates']} candidates"
    return units


def pairs_of(units: list[dict]) -> list[tuple]:
    """(s1, s2, gold) of every pair of the units, in order."""
    return [(u["texts"][str(a)], u["texts"][str(b)], gold) for u in units for a, b, _, gold in u["pairs"]]


def count_items(units: list[dict], rerank_to: int = 0) -> int:
    """(sentence, context) items the scoring stage scores for these units: for each pair, both sentences in
    the contexts of both, each item once a unit. With `rerank_to` (units read with a shortlist), about what the
    re-rank adds: each longer shortlist whole, less the |C_s| kept contexts it scored for Eq. 4 (the Eq. 4
    items counted over the shortlist's first |C_s|, which the re-rank's choice may overlap otherwise)."""
    total = 0
    for u in units:
        ctx = {s: [c["centre_id"] for c in cs["contexts"]][:rerank_to or None] for s, cs in u["csets"].items()}
        if rerank_to:
            total += sum(len(cs["contexts"]) - rerank_to for cs in u["csets"].values()
                         if len(cs["contexts"]) > rerank_to)
        need = set()
        for a, b, _, _ in u["pairs"]:
            keys = ctx[str(a)] + ctx[str(b)]
            need.update((s, k) for s in (a, b) for k in keys)
        total += len(need)
    return total


# ---------------------------------------------------------------------------------------------- score files

def write_scores(path: Path, pairs: list[tuple], tfidf: np.ndarray, by_size: dict) -> None:
    """One JSON line a pair; `by_size`: {K: [row of ScoreStage for each pair]} (rows with score, null_reason,
    n_ctx_s1, n_ctx_s2)."""
    lines = []
    for i, (s1, s2, gold) in enumerate(pairs):
        row = {"s1": s1, "s2": s2, "gold": gold, "tfidf": float(tfidf[i])}
        for k, rows in sorted(by_size.items(), key=lambda kv: parse_size(kv[0])):
            r = rows[i]
            row[f"score_{k}"] = None if r.get("score") is None else float(r["score"])
            row[f"null_{k}"] = r.get("null_reason")
            row[f"ctx_{k}"] = int((r.get("n_ctx_s1") or 0) + (r.get("n_ctx_s2") or 0))
        lines.append(json.dumps(row))
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)


def read_scores(path: Path) -> list[dict]:
    return [json.loads(x) for x in gzip.open(path, "rt", encoding="utf-8").read().splitlines() if x]


def sizes_of(rows: list[dict]) -> list[str]:
    """The |C_s| labels a score file holds ("16", "100", "16/100"), smallest first."""
    return sorted((k.split("_", 1)[1] for k in rows[0] if k.startswith("score_")), key=parse_size) if rows else []


def _ranks(v: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Average ranks (1-based, ties sharing their mean rank, as scipy's rankdata) of v[idx] along each row:
    a value's rank in a resample is the count of smaller values drawn plus (its own count + 1) / 2."""
    _, dense = np.unique(v, return_inverse=True)
    m, reps = int(dense.max()) + 1, idx.shape[0]
    d = dense.reshape(-1)[idx]
    counts = np.bincount((d + m * np.arange(reps)[:, None]).ravel(), minlength=reps * m).reshape(reps, m)
    avg = np.cumsum(counts, axis=1) - counts + (counts + 1) / 2
    return np.take_along_axis(avg, d, axis=1)


def _spearman_rows(x: np.ndarray, g: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Spearman x 100 of x[idx] against g[idx], one per row of idx (Pearson of average ranks, as scipy's
    spearmanr; NaN for a row whose values are all equal)."""
    rx, rg = _ranks(x, idx), _ranks(g, idx)
    rx -= rx.mean(axis=1, keepdims=True)
    rg -= rg.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * rg).sum(axis=1) / np.sqrt((rx * rx).sum(axis=1) * (rg * rg).sum(axis=1)) * 100


def _resamples(n: int, reps: int, seed: int) -> np.ndarray:
    """The resampled rows bench/common.py draws: one rng.integers(0, n, n) a resample, in order."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, n, n) for _ in range(reps)])


def bootstrap(pred, gold, n: int = 1000, seed: int = 0) -> tuple:
    """bench/common.py's bootstrap (the same resamples, the same statistic), all resamples at once: seconds
    there for 1,379 pairs, a fraction of one here."""
    from scipy.stats import spearmanr

    ok = np.isfinite(pred)
    pred, gold = np.asarray(pred, dtype=float)[ok], np.asarray(gold, dtype=float)[ok]
    i = _resamples(len(pred), n, seed)
    stats = _spearman_rows(pred, gold, i)
    return (spearmanr(pred, gold).statistic * 100, np.nanpercentile(stats, 2.5), np.nanpercentile(stats, 97.5),
            int(ok.sum()))


def paired_bootstrap(a, b, gold, n: int = 2000, seed: int = 0) -> tuple:
    """bench/common.py's paired_bootstrap, all resamples at once: (a - b, low, high), Spearman x 100."""
    from scipy.stats import spearmanr

    a, b, gold = (np.asarray(x, dtype=float) for x in (a, b, gold))
    i = _resamples(len(gold), n, seed)
    diffs = _spearman_rows(a, gold, i) - _spearman_rows(b, gold, i)
    return ((spearmanr(a, gold).statistic - spearmanr(b, gold).statistic) * 100,
            np.nanpercentile(diffs, 2.5), np.nanpercentile(diffs, 97.5))


def summarise(rows: list[dict]) -> dict:
    """Per |C_s| (a string key): Origin's Spearman x 100 and TF-IDF's on the pairs Origin scored, each with
    its 95% bootstrap interval, and their paired difference with its interval."""
    gold = np.array([r["gold"] for r in rows], dtype=float)
    tf = np.array([r["tfidf"] for r in rows], dtype=float)
    out = {}
    for k in sizes_of(rows):
        s = np.array([np.nan if r[f"score_{k}"] is None else r[f"score_{k}"] for r in rows], dtype=float)
        ok = np.isfinite(s)
        if ok.sum() < 3:
            out[str(k)] = {"pairs": len(rows), "scored": int(ok.sum()), "spearman": None, "tfidf": None,
                           "diff": None, "diff_ci": None}
            continue
        o, t = bootstrap(s, gold), bootstrap(tf[ok], gold[ok])
        d = paired_bootstrap(s[ok], tf[ok], gold[ok])
        out[str(k)] = {"pairs": len(rows), "scored": int(ok.sum()), "spearman": float(o[0]),
                       "spearman_ci": [float(o[1]), float(o[2])], "tfidf": float(t[0]),
                       "tfidf_ci": [float(t[1]), float(t[2])], "diff": float(d[0]), "diff_ci": [float(d[1]),
                                                                                          float(d[2])],
                       "contexts_per_pair": float(np.mean([r[f"ctx_{k}"] for r in rows]))}
    return out


def report(out: Path) -> dict:
    """{set: summarise(its score file)} for every teacher-*.jsonl.gz in `out`."""
    return {p.name[len("teacher-"):-len(".jsonl.gz")]: summarise(read_scores(p))
            for p in sorted(out.glob("teacher-*.jsonl.gz"))}


def table(teacher: dict) -> str:
    """The teacher's rows, as BENCHMARKS.md shows them."""
    def ci(x):
        return f"[{x[0]:.1f}, {x[1]:.1f}]" if x else ""

    lines = ["| set | \\|C_s\\| | pairs scored | Origin | TF-IDF, same pairs | Origin - TF-IDF (paired) |",
             "|---|---:|---:|---|---|---|"]
    for name, by_k in teacher.items():
        for k, r in by_k.items():
            if r["spearman"] is None:
                lines.append(f"| {name} | {k} | {r['scored']}/{r['pairs']} | - | - | - |")
                continue
            lines.append(f"| {name} | {k} | {r['scored']}/{r['pairs']} | {r['spearman']:.2f} {ci(r['spearman_ci'])} "
                         f"| {r['tfidf']:.2f} {ci(r['tfidf_ci'])} | {r['diff']:+.2f} "
                         f"[{r['diff_ci'][0]:+.1f}, {r['diff_ci'][1]:+.1f}] |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("contexts", help="context sets of pair sets, as the harvest makes them (no Ray)")
    c.add_argument("--corpus", required=True)
    c.add_argument("--index", default="", help="the corpus's TF-IDF index (default OUT/index, built there)")
    c.add_argument("--out", required=True)
    c.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=FILE")
    c.add_argument("--size", type=int, default=100)
    c.add_argument("--limit", type=int, default=0, help="the first N pairs of each set only")
    c.add_argument("--workers", type=int, default=1, help="processes selecting contexts (forked)")
    r = sub.add_parser("report", help="the teacher's tables from a run's score files")
    r.add_argument("dir")
    a = ap.parse_args(argv)
    if a.cmd == "report":
        teacher = report(Path(a.dir))
        print(table(teacher))
        print(json.dumps(teacher))
        return 0
    out = Path(a.out)
    index = a.index or str(out / "index")
    t0 = time.perf_counter()
    index_s = ensure_index(a.corpus, index)
    print(f"index {index}: {index_s:.1f} s to build", flush=True)
    from sentsim.errors import UsageError

    # a set that cannot be read is not made, and said to be; the others are (bench/gpu.py scores those)
    sets, failed = {}, {}
    for name, path in (s.split("=", 1) for s in a.sets):
        try:
            sets[name] = read_set(path, a.limit)
        except (UsageError, OSError) as exc:
            failed[name] = one_line(exc)
            print(f"contexts {name}: not made: {failed[name]}", flush=True)
    info = make_contexts(a.corpus, index, sets, a.size, out, a.workers)
    info["failed"] = failed | info["failed"]
    import resource

    cpu = sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime
              for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    info.update(index_s=index_s, total_s=time.perf_counter() - t0, cpu_s=cpu, size=a.size, workers=a.workers)
    print(f"contexts: {info['total_s']:.1f} s in all, {cpu:.1f} CPU-s", flush=True)
    (out / f"contexts-k{a.size}.json").write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
