"""Reading a harvest for the students, and checking it before any worker starts.

Every problem is a UsageError (or InputError) naming the file: rank vectors of another anchor set,
no rank vectors at all, a relation file with unknown relations or missing fields, an empty source.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sentsim.errors import InputError, UsageError

TRIPLE_SCHEMA = pa.schema([("s_i", pa.string()), ("relation", pa.string()), ("s_j", pa.string()),
                           ("hard_negative", pa.string())])


def harvest_root(data: str):
    """The harvest run (local or s3://) as a storage.RunReader; str() of it is its URI."""
    from sentsim.surrogate.data import open_harvest

    return open_harvest(data)


def harvest_content(root) -> dict:
    """What a student's fingerprint holds of its harvest: the harvest run's fingerprint and the content of the
    tables the objectives read (pairs, sentences), as their unit markers record it (the surrogate's
    `shards_content`), not its path: a harvest moved or copied is the same data, one redone in place is not."""
    from sentsim.surrogate.data import pairs_content, shards_content

    return {"harvest": (root.manifest or {}).get("fingerprint"), "pairs_sha256": pairs_content(root),
            "sentences_sha256": shards_content(root, "sentences")}


def read_manifest(root) -> dict:
    if not root.manifest:
        raise UsageError(f"--data {root}: no manifest.json (not a harvest output)")
    return root.manifest


def shard_files(root, table: str) -> list[str]:
    """Exactly the table's completed shards (a unit marker names each)."""
    files = root.files(table, required=False)
    if not files:
        raise UsageError(f"--data {root}: no completed {table}/*.parquet shards")
    return files


def read_table(root, table: str, columns: list[str], numeric: Sequence[str] = ()) -> pa.Table:
    shard_files(root, table)
    return root.read_table(table, columns, numeric=numeric)


def harvest_pairs(root) -> tuple[pa.Table, Optional[dict], dict]:
    """The run's pairs (s1, s2, score, split), checked as the surrogate checks them (no NaN or infinite
    score, no split but train, dev and test); the dev carve when the harvest has too few scored dev (or
    test) pairs (the surrogate's rule, sentsim.surrogate.data.plan_dev_carve); and the pairs that are not
    train pairs, by why (sentsim.surrogate.data.pairs_left_out)."""
    from sentsim.surrogate.data import (
        MIN_DEV_PAIRS,
        SPLITS,
        keep_split,
        pairs_left_out,
        plan_dev_carve,
        refuse_nonfinite_scores,
        refuse_unknown_splits,
    )

    t = read_table(root, "pairs", ["s1", "s2", "score", "split"], numeric=["score"])  # a text score is named, not cast
    refuse_nonfinite_scores(t["score"], f"--data {root}")
    refuse_unknown_splits(t["split"], f"--data {root}")
    scored = {s: keep_split(t, s).num_rows for s in SPLITS}
    have = {s: scored[s] for s in ("dev", "test")}
    carve = (plan_dev_carve(keep_split(t, "train").select(["s1", "s2"]), have)
             if min(have.values()) < MIN_DEV_PAIRS else None)
    return t, carve, pairs_left_out(t.num_rows, scored, carve)


def scored_pairs(root, split: Optional[str] = "train") -> pa.Table:
    """Scored pairs of `split` (every split: None), after the dev carve (harvest_pairs), which is printed
    once, when dev is read."""
    from sentsim.surrogate.data import carve_note, keep_split

    t, carve, _ = harvest_pairs(root)
    if not split:
        return t.filter(pc.is_valid(t["score"]))
    if carve and split == "dev":
        print(carve_note(carve))
    return keep_split(t, split, carve)


# ----------------------------------------------------------------------------- RankEncoder


def rank_settings(manifest: dict, root) -> dict:
    rank = (manifest.get("config") or {}).get("rank") or {}
    if not rank.get("enabled", True):
        raise UsageError(f"--data {root}: the harvest ran with rank.enabled=false, so it holds no rank vectors")
    if "n_anchors" not in rank:
        raise UsageError(f"--data {root}: manifest.json has no config.rank.n_anchors; cannot read rank vectors")
    return rank


def distinct_sentences(t: pa.Table) -> pa.Table:
    """One row per sentence_id, the first: a harvest writes a sentence's (identical) row once for every unit
    it is paired in, and a sentence twice in the training rows would be weighted twice and, in one batch, be
    its own in-batch negative."""
    ids = t["sentence_id"].to_numpy(zero_copy_only=False)
    _, first = np.unique(ids, return_index=True)
    return t if len(first) == t.num_rows else t.take(pa.array(np.sort(first)))


def rank_sentences(root, manifest: dict) -> tuple[pa.Table, int, int]:
    """(table of text and rank_codes, or of text and base_vector for a rank.storage=vectors run, one row per
    sentence; the number of anchors; the sentences table's rows). Rows without rank codes (or base vectors)
    are an error."""
    from sentsim.rank import RankCodec

    rank = rank_settings(manifest, root)
    n = int(rank["n_anchors"])
    shard_files(root, "sentences")
    if "base_vector" in root.schema("sentences").names:
        t = read_table(root, "sentences", ["sentence_id", "text", "base_vector"])
        if t.num_rows and t["base_vector"].null_count < t.num_rows:
            return *vector_sentences(root, manifest, distinct_sentences(t)), t.num_rows
    t = read_table(root, "sentences", ["sentence_id", "text", "rank_codes"])
    rows = t.num_rows
    t = distinct_sentences(t)
    if t.num_rows == 0:
        raise UsageError(f"--data {root}: the sentences table is empty")
    if t["rank_codes"].null_count:
        raise UsageError(f"--data {root}: {t['rank_codes'].null_count} sentence(s) have no rank vector")
    lengths = pc.list_value_length(t["rank_codes"])
    mm = pc.min_max(lengths)
    # the codes' length is the run's anchor count: codes from another anchor set (another harvest
    # merged in, or a run with a different rank.n_anchors) show up here first
    n_actual = int(pc.count(pc.unique(lengths)).as_py()), int(mm["min"].as_py()), int(mm["max"].as_py())
    if n_actual[1] != n or n_actual[2] != n:
        raise UsageError(f"--data {root}: rank vectors have {n_actual[1]}..{n_actual[2]} entries, but the harvest's "
                         f"anchor set (manifest rank.n_anchors) has {n}; they come from another anchor set")
    codec = RankCodec(n, int(rank.get("bits", 16)))
    top = pc.max(pc.list_flatten(t["rank_codes"])).as_py()
    if top is not None and top > (n - 1) // codec.step:
        raise UsageError(f"--data {root}: rank code {top} is out of range for {n} anchors at {codec.bits} bits")
    return t.select(["text", "rank_codes"]), n, rows


def vector_sentences(root, manifest: dict, t: pa.Table) -> tuple[pa.Table, int]:
    """rank.storage=vectors: every sentence has a base vector, of the anchor matrix's dimension."""
    n_null = t["base_vector"].null_count
    if n_null:
        raise UsageError(f"--data {root}: {n_null} of {t.num_rows} sentence(s) have no base vector "
                         "(rank.storage=vectors)")
    dims = pc.unique(pc.list_value_length(t["base_vector"])).to_pylist()
    anchors = anchor_vectors(root, manifest)
    if dims != [anchors.shape[1]]:
        raise UsageError(f"--data {root}: base vectors have {'/'.join(map(str, sorted(dims)))} dimensions but the "
                         f"run's anchor matrix (_side/rank_anchors.parquet) has {anchors.shape[1]}; they come from "
                         "another base encoder or another run")
    return t.select(["text", "base_vector"]), int(anchors.shape[0])


def anchor_vectors(root, manifest: dict) -> np.ndarray:
    """The run's anchor matrix [n, dim] (float16), or one UsageError line naming what is wrong."""
    from sentsim.harvest.anchors import stored_anchor_vectors

    return stored_anchor_vectors(root.store, manifest.get("fingerprint"), where=f"--data {root}")


def recover_anchors(manifest: dict, root) -> tuple[np.ndarray, list[str]]:
    """The harvest's anchor sentences: the run's `rank_anchors` side table when it has one (harvests
    from this version on), else re-sampled exactly as older harvests did (seed + 1 over the corpus)."""
    from sentsim.harvest.anchors import ANCHORS_TABLE
    from sentsim.rank.targets import sample_anchors
    from storage import ShardStore

    store = root.store if hasattr(root, "store") else ShardStore(str(root))
    stored = store.read_side_table(ANCHORS_TABLE, fingerprint=manifest.get("fingerprint"))
    if stored is not None:
        return stored.column("sentence_id").to_numpy(), stored.column("text").to_pylist()
    cfg = manifest.get("config") or {}
    corpus = cfg.get("corpus")
    if not corpus or not _corpus_reachable(corpus):
        raise UsageError(f"--data {root}: the harvest's corpus {corpus!r} is not reachable, so its anchor sentences "
                         "cannot be recovered (needed to check the rank vectors and for RankEncoder inference); "
                         "set rankencoder.check_sentences=0 to train without the check")
    return sample_anchors(corpus, int(cfg["rank"]["n_anchors"]), seed=int(cfg.get("seed", 0)) + 1)


def _corpus_reachable(corpus: str) -> bool:
    from corpus.view import open_corpus

    try:
        return bool(open_corpus(corpus).files("sentences", required=False))
    except UsageError:
        return False


def harvest_base_encoder(manifest: dict) -> str:
    from sentsim.bundled_model import default_base_encoder

    return ((manifest.get("config") or {}).get("rank") or {}).get("encoder") or default_base_encoder()


def check_anchor_set(root, manifest: dict, sentences: pa.Table, n_check: int,
                     base_encoder: Optional[str] = None, min_rho: float = 0.98) -> tuple[np.ndarray, list[str]]:
    """Prove that the stored rank vectors are the base encoder's ranks over the harvest's anchors:
    re-compute `n_check` of them and compare (Spearman of stored vs fresh ranks >= min_rho).

    `base_encoder`, when given, must be the same checkpoint as the harvest's rank.encoder.
    Returns (anchor ids, anchor texts), which the RankEncoder scorer needs at inference.
    """
    from scipy.stats import spearmanr

    from sentsim.identity import checkpoint_hash
    from sentsim.rank.targets import RankTargets

    e1 = harvest_base_encoder(manifest)
    if base_encoder:
        from sentsim.encoder_folder import encoder_folder

        encoder_folder(base_encoder, "rankencoder.base_encoder")
    if base_encoder and checkpoint_hash(base_encoder) != checkpoint_hash(e1):
        raise UsageError(f"--data {root}: its rank vectors were computed with base encoder {e1}, not {base_encoder}; "
                         "rank vectors from another base encoder cannot be used")
    ids, texts = recover_anchors(manifest, root)
    if n_check <= 0:
        return ids, texts
    if "base_vector" in sentences.column_names:
        check_base_vectors(root, manifest, sentences, ids, texts, n_check, e1)
        return ids, texts
    rank = manifest["config"]["rank"]
    targets = RankTargets(e1, ids, texts, bits=int(rank.get("bits", 16)), device="cpu")
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(sentences.num_rows, size=min(n_check, sentences.num_rows), replace=False))
    sample = sentences.take(pa.array(pick))
    fresh = targets.codes(sample["text"].to_pylist()).astype(np.float64)
    stored = np.asarray(sample["rank_codes"].to_pylist(), dtype=np.float64)
    rhos = [spearmanr(a, b).statistic for a, b in zip(stored, fresh)]
    worst = float(np.nanmin(rhos)) if rhos else 1.0
    if not worst >= min_rho:
        raise UsageError(f"--data {root}: stored rank vectors do not match base encoder {e1} over the harvest's "
                         f"{len(ids)} anchors (Spearman stored vs recomputed as low as {worst:.3f}); they come "
                         "from another anchor set or another base encoder")
    return ids, texts


def check_base_vectors(root, manifest: dict, sentences: pa.Table, ids, texts, n_check: int, e1: str,
                       min_cos: float = 0.99) -> None:
    """rank.storage=vectors: `n_check` stored sentence vectors and `n_check` rows of the anchor matrix
    re-encoded with E1 must agree (cosine >= min_cos; float16 keeps about 0.9999), without encoding
    every anchor as the codes check must."""
    from sentsim.rank.targets import embed_texts

    anchors = anchor_vectors(root, manifest)
    if anchors.shape[0] != len(ids):
        raise UsageError(f"--data {root}: the anchor matrix has {anchors.shape[0]} rows but the run has {len(ids)} "
                         "anchor sentences; _side/rank_anchors.parquet is not this run's")
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(sentences.num_rows, size=min(n_check, sentences.num_rows), replace=False))
    pick_a = np.sort(rng.choice(len(ids), size=min(n_check, len(ids)), replace=False))
    sample = sentences.take(pa.array(pick))
    stored = np.concatenate([np.asarray(sample["base_vector"].to_pylist(), dtype=np.float32),
                             anchors[pick_a].astype(np.float32)])
    fresh = embed_texts(e1, sample["text"].to_pylist() + [texts[i] for i in pick_a], device="cpu")
    cos = np.sum(stored * fresh, axis=1) / np.maximum(np.linalg.norm(stored, axis=1) * np.linalg.norm(fresh, axis=1),
                                                       1e-12)
    worst = float(cos.min()) if len(cos) else 1.0
    if not worst >= min_cos:
        raise UsageError(f"--data {root}: stored base vectors or anchor matrix do not match base encoder {e1} "
                         f"(cosine stored vs recomputed as low as {worst:.3f}); they come from another base encoder")


# ----------------------------------------------------------------------------- RSE


def _text_lines(p: Path) -> list[str]:
    """The lines of a UTF-8 text file, gzip-compressed or not (by its first bytes, as the corpus readers
    tell), as pairs_file.decode_text reads them: a byte-order mark dropped, bad bytes and a truncated
    gzip stream an InputError naming the file."""
    import gzip

    from sentsim.pairs_file import decode_text, split_lines

    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InputError(f"{p}: unreadable or truncated gzip file ({exc})") from None
    return split_lines(decode_text(p, raw))


def read_triples_file(path: str, allowed: Optional[list[str]] = None) -> pa.Table:
    """A user file of (s_i, relation, s_j[, hard_negative]) rows, JSONL(.gz) or Parquet."""
    from corpus.documents import json_refusal, surrogate_refusal

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"rse.triples {path}: " + ("is a folder, not a file" if p.is_dir() else "no such file"))
    name = p.name.lower()
    rows = []
    if name.endswith(".parquet"):
        try:
            t = pq.read_table(p)
        except Exception as exc:
            raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
        missing = [c for c in ("s_i", "relation", "s_j") if c not in t.column_names]
        if missing:
            raise InputError(f"{path}: missing field(s) {', '.join(missing)}; need s_i, relation, s_j[, hard_negative]")
        try:
            rows = t.to_pylist()
        except UnicodeDecodeError:  # a Parquet writer does not check that a string column's bytes are UTF-8
            raise InputError(f"{path}: a text column holds bytes that are not UTF-8") from None
        where = lambda i: f"{path}: row {i}"  # noqa: E731
    elif name.endswith((".jsonl", ".jsonl.gz", ".json")):
        for i, line in enumerate(_text_lines(p), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as exc:  # ValueError: malformed, or an integer too long to read
                raise InputError(f"{path}:{i}: {json_refusal(exc)}") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{i}: expected an object with s_i, relation, s_j")
            for k in ("s_i", "relation", "s_j", "hard_negative"):
                reason = surrogate_refusal(obj[k], k) if isinstance(obj.get(k), str) else None
                if reason:  # refused here, not later by the Parquet writer
                    raise InputError(f"{path}:{i}: {reason}")
            rows.append(obj)
        where = lambda i: f"{path}:{i}"  # noqa: E731
    else:
        raise UsageError(f"rse.triples {path}: use .jsonl, .jsonl.gz or .parquet")
    out = {k: [] for k in TRIPLE_SCHEMA.names}
    for i, r in enumerate(rows, start=1):
        missing = [k for k in ("s_i", "relation", "s_j") if not isinstance(r.get(k), str) or not r.get(k).strip()]
        if missing:
            raise InputError(f"{where(i)}: missing or empty field(s) {', '.join(missing)}")
        if allowed is not None and r["relation"] not in allowed:
            raise InputError(f"{where(i)}: unknown relation {r['relation']!r}; allowed: {', '.join(allowed)}")
        hn = r.get("hard_negative")
        if hn is not None and not isinstance(hn, str):
            raise InputError(f"{where(i)}: hard_negative must be a string")
        out["s_i"].append(r["s_i"])
        out["relation"].append(r["relation"])
        out["s_j"].append(r["s_j"])
        out["hard_negative"].append(hn or None)
    if not out["s_i"]:
        raise InputError(f"{path}: no triples")
    return pa.Table.from_pydict(out, schema=TRIPLE_SCHEMA)


def _relation_cuts(scores, rc) -> tuple:
    """(positive mask, hard-negative mask, why a pair is no positive, which pairs are hard negatives) over
    the train split's scores: by rse.score_threshold / rse.hard_negative_below, or by rank where
    rse.positive_top_fraction / rse.hard_negative_bottom_fraction is set (ties broken by row order, so a
    fraction is exact)."""
    n = len(scores)
    rank = scores.rank(method="first").to_numpy()  # 1 = the lowest score
    top, bottom = rc.positive_top_fraction, rc.hard_negative_bottom_fraction
    if top is None:
        is_pos = (scores >= rc.score_threshold).to_numpy()
        not_pos = f"below rse.score_threshold {rc.score_threshold:g}"
    else:
        is_pos = rank > n - math.ceil(top * n)
        not_pos = f"outside the top rse.positive_top_fraction {top:g}"
    if bottom is None:
        is_low = (scores < rc.hard_negative_below).to_numpy()
        low_rule = f"below rse.hard_negative_below {rc.hard_negative_below:g}"
    else:
        is_low = rank <= math.floor(bottom * n)
        low_rule = f"in the bottom rse.hard_negative_bottom_fraction {bottom:g}"
    return is_pos, is_low & ~is_pos, not_pos, low_rule  # a positive is never also a hard negative


def rse_triples(root: Optional[Path], cfg) -> tuple[pa.Table, list[str], dict]:
    """All relation sources as one triples table; (table, relation names in id order, counts per source)."""
    rng = np.random.default_rng(cfg.seed)
    rc = cfg.rse
    parts, counts = [], {}
    if root is not None and rc.context_similar:
        from sentsim.surrogate.data import keep_split, training_note

        run, carve, left_out = harvest_pairs(root)
        t = keep_split(run, "train", carve).to_pandas()
        is_pos, is_low, not_pos, low_rule = _relation_cuts(t.score, rc)
        pos = t[is_pos]
        print(training_note(len(pos), run.num_rows, "pairs as context-similar triples",
                            {**left_out, f"train {not_pos}": len(t) - len(pos)}))
        low = t[is_low]
        print(f"note: {len(low)} train pairs {low_rule} give the context-similar triples their hard negatives"
              + (f" (train scores {t.score.min():.3f} to {t.score.max():.3f}, median {t.score.median():.3f})"
                 if len(t) else ""))
        if len(t) and len(pos) == len(t) and rc.positive_top_fraction is None:
            print(f"note: every train pair reaches rse.score_threshold {rc.score_threshold:g}, so every pair is a "
                  "positive; rse.positive_top_fraction cuts by rank instead")
        hard_of: dict[str, str] = {}
        for a, b in zip(low.s1, low.s2):  # a partner the teacher scored dissimilar: the hardest negative we have
            hard_of.setdefault(a, b)
            hard_of.setdefault(b, a)
        parts.append(pa.Table.from_pydict({
            "s_i": pos.s1.tolist(), "relation": ["context-similar"] * len(pos), "s_j": pos.s2.tolist(),
            "hard_negative": [hard_of.get(a) for a in pos.s1]}, schema=TRIPLE_SCHEMA))
        counts["context-similar"] = len(pos)
    if root is not None and rc.same_sent:
        from sentsim.surrogate.data import training_note

        rows = read_table(root, "sentences", ["text"])["text"].to_pylist()
        texts = [s for s in dict.fromkeys(rows) if s and s.strip()]
        distinct = len(texts)
        if len(texts) > rc.same_sent_max:
            texts = [texts[i] for i in sorted(rng.choice(len(texts), rc.same_sent_max, replace=False))]
        print(training_note(len(texts), len(rows), "sentences as same-sent triples",
                            {"repeated or empty texts": len(rows) - distinct,
                             f"over rse.same_sent_max {rc.same_sent_max}": distinct - len(texts)}))
        parts.append(pa.Table.from_pydict({"s_i": texts, "relation": ["same-sent"] * len(texts), "s_j": texts,
                                           "hard_negative": [None] * len(texts)}, schema=TRIPLE_SCHEMA))
        counts["same-sent"] = len(texts)
    if rc.triples:
        t = read_triples_file(rc.triples, rc.relations)
        parts.append(t)
        for r, n in zip(*np.unique(t["relation"].to_numpy(zero_copy_only=False), return_counts=True)):
            counts[str(r)] = counts.get(str(r), 0) + int(n)
    parts = [p for p in parts if p.num_rows]
    if not parts:
        raise UsageError("rse: no training triples (no harvested pair reaches rse.score_threshold, same_sent is off "
                         "and no rse.triples file was given)")
    table = pa.concat_tables(parts)
    relations = list(dict.fromkeys(table["relation"].to_pylist()))
    # in-relation hard negatives (000 §3.3): a triple without one gets a random tail of its own relation
    by_rel: dict[str, list[str]] = {}
    for r, tail in zip(table["relation"].to_pylist(), table["s_j"].to_pylist()):
        by_rel.setdefault(r, []).append(tail)
    hard = table["hard_negative"].to_pylist()
    for i, (r, head, tail) in enumerate(zip(table["relation"].to_pylist(), table["s_i"].to_pylist(),
                                            table["s_j"].to_pylist())):
        if hard[i] is None:
            pool = by_rel[r]
            for _ in range(4):
                cand = pool[int(rng.integers(len(pool)))]
                if cand not in (head, tail):
                    hard[i] = cand
                    break
    table = table.set_column(3, "hard_negative", pa.array(hard, pa.string()))
    rel_id = {r: i for i, r in enumerate(relations)}
    table = table.append_column("relation_id", pa.array([rel_id[r] for r in table["relation"].to_pylist()], pa.int32()))
    return table, relations, counts


# ----------------------------------------------------------------------------- PaSeR


def paser_examples(texts: list[str], mask_token: str, top_k: int, max_words: int) -> tuple[pa.Table, dict]:
    """(text, masked, target) rows; sentences without a RAKE phrase are skipped and counted."""
    from sentsim.students.rake import mask_phrases, top_phrases

    out = {"text": [], "masked": [], "target": []}
    skipped, examples = 0, []
    distinct = dict.fromkeys(texts)
    for s in distinct:
        phrases = top_phrases(s or "", top_k, max_words=max_words)
        if not phrases:
            skipped += 1
            if len(examples) < 5:
                examples.append(s)
            continue
        out["text"].append(s)
        out["masked"].append(mask_phrases(s, phrases, mask_token))
        out["target"].append(" ; ".join(p.text for p in phrases))
    if not out["text"]:
        raise UsageError(f"paser: none of the {skipped} sentences has an extractable RAKE phrase")
    return pa.Table.from_pydict(out), {"sentences": len(out["text"]), "skipped_no_phrase": skipped,
                                       "skipped_examples": examples, "repeated": len(texts) - len(distinct)}
