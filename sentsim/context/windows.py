"""Windows (c_<i, s_i, c_>i) and the seq2seq examples built from them, shared by training and scoring.

Layout of one example (k = `context_sentences`; a token's *slot* is the window sentence it belongs to and
selects its sentence-position embedding, paper §3.2.2; slot 0 = special tokens):

    slots:     1..k                 k+1             k+2..2k+1
    source:    <tag> [c_<i] <sep> [s_i or <blank>] <sep> [c_>i or <blank>] </s>
    fwd   p(s | c<, c>):   source has <blank> in the s slot,   target = s
    left  p(c< | s, c>):   source has <blank> in the c< slots, target = c<
    right p(c> | c<, s):   source has <blank> in the c> slots, target = c>
    decoder input = <bos> + target,   labels = target + </s>

Over-long parts are truncated (left context keeps its last tokens, the others their first ones) so the
source fits `max_source_tokens`; a target longer than `max_target_tokens` keeps its first tokens and loses
its </s>. Both are reported per item. An empty target means the direction is *missing* for that item.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from corpus.documents import doc_key_of
from sentsim.errors import UsageError


@dataclass
class Example:
    src: list[int]
    src_slots: list[int]
    tgt: list[int]  # labels, ending with </s> unless truncated
    tgt_slots: list[int]
    src_truncated: int = 0  # tokens cut from the source
    tgt_truncated: int = 0  # tokens cut from the target


def _water_fill(lengths: Sequence[int], budget: int) -> int:
    """Largest cap c with sum(min(l, c)) <= budget."""
    if sum(lengths) <= budget:
        return max(lengths, default=0)
    lo, hi = 0, max(lengths)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(x, mid) for x in lengths) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def build_example(
    ids: dict,
    k: int,
    direction: str,
    left: Sequence[Sequence[int]],
    sent: Sequence[int],
    right: Sequence[Sequence[int]],
    max_source: int,
    max_target: int,
) -> Optional[Example]:
    """`ids` holds the tokenizer role ids; `left`/`right` are lists of tokenised sentences (nearest last /
    first). Returns None when the direction's target is empty (a missing direction)."""
    left = [list(x) for x in left if len(x)][-k:] if left else []
    right = [list(x) for x in right if len(x)][:k] if right else []
    sent = list(sent)
    # Slots: left sentences end at slot k, the centre is k+1, right sentences start at k+2.
    left_slots = [k - len(left) + 1 + j for j in range(len(left))]
    right_slots = [k + 2 + j for j in range(len(right))]

    def flat(sents, slots):
        toks, sl = [], []
        for s, sl_id in zip(sents, slots):
            toks.extend(s)
            sl.extend([sl_id] * len(s))
        return toks, sl

    lt, ls = flat(left, left_slots)
    rt, rs = flat(right, right_slots)
    ct, cs = sent, [k + 1] * len(sent)
    tag = ids[f"tag_{direction}"]
    blank = ids["blank"]
    if direction == "fwd":
        target, tslots = ct, cs
        ct, cs = [blank], [k + 1]
    elif direction == "left":
        target, tslots = lt, ls
        lt, ls = [blank], [k]
    elif direction == "right":
        target, tslots = rt, rs
        rt, rs = [blank], [k + 2]
    else:
        raise ValueError(f"unknown direction {direction!r}")
    if not target:
        return None

    overhead = 4  # tag, two separators, </s>
    budget = max_source - overhead
    src_trunc = 0
    if len(lt) + len(ct) + len(rt) > budget:
        cap = _water_fill([len(lt), len(ct), len(rt)], budget)
        src_trunc = sum(max(0, len(x) - cap) for x in (lt, ct, rt))
        if len(lt) > cap:
            lt, ls = lt[len(lt) - cap:], ls[len(ls) - cap:]
        ct, cs = ct[:cap], cs[:cap]
        rt, rs = rt[:cap], rs[:cap]
    src = [tag] + lt + [ids["sep"]] + ct + [ids["sep"]] + rt + [ids["eos"]]
    src_slots = [0] + ls + [0] + cs + [0] + rs + [0]

    tgt_trunc = 0
    if len(target) + 1 > max_target:
        tgt_trunc = len(target) + 1 - max_target
        tgt, tsl = target[:max_target], tslots[:max_target]
    else:
        tgt, tsl = target + [ids["eos"]], tslots + [0]
    return Example(src, src_slots, tgt, tsl, src_trunc, tgt_trunc)


# ----------------------------------------------------------------------------------------------- corpus


def open_sentences(corpus: str):
    """The corpus run (local or s3://) with at least one completed sentences shard."""
    from corpus.view import open_corpus

    reader = open_corpus(corpus)
    if not reader.files("sentences", required=False):
        raise UsageError(f"{corpus}: no sentences/part-*.parquet (is this a corpus built by `sentsim corpus build`?)")
    return reader


def doc_bucket(doc_key: int) -> int:
    """Stable 0..9999 bucket of a document, for the held-out split and worker sharding."""
    return zlib.crc32(int(doc_key).to_bytes(8, "little", signed=True)) % 10000


def doc_slice(doc_key: int, slices: int) -> int:
    """Which of `slices` interleaved parts of the corpus a document falls in; a hash of its own,
    independent of `doc_bucket`, so every slice holds its share of held-out and of each worker."""
    return zlib.crc32(int(doc_key).to_bytes(8, "little", signed=True) + b"slice") % slices


def iter_documents(
    corpus: str,
    heldout_percent: float,
    split: str = "train",
    rank: int = 0,
    world: int = 1,
    order_seed: Optional[int] = None,
    slices: int = 64,
    doc_prefixes: Sequence[str] = (),
) -> Iterator[list[str]]:
    """Runs of consecutive sentences of one document, streamed part by part (a gap in sent_idx starts a
    new run). split: "train" | "heldout" | "all". Training documents are sharded over `world` workers.

    order_seed None: corpus order, which is source by source (all of Wikipedia, then Gutenberg...).
    With a seed, documents come slice by slice (`doc_slice`), the slices in a permutation of that
    seed, and each slice's documents in a permutation of their own: a slice holds its share of every
    source, and shuffled, any stretch of the stream does too. (A slice read in corpus order gave a
    training run shorter than one slice, as every run on a CPU is, Wikipedia and then Gutenberg.)
    Each slice is one scan of the sentences table (seconds, against hours of training on it), and
    its documents are held in memory while they are handed out: 1/`slices` of the corpus' text.

    doc_prefixes: only documents whose doc_id starts with one of them (all documents when empty)."""
    if order_seed is None:
        yield from _scan(corpus, heldout_percent, split, rank, world, None, doc_prefixes)
        return
    for part, docs in iter_slices(corpus, heldout_percent, split, rank, world, order_seed, slices, doc_prefixes):
        random.Random(mix_seed(order_seed, part)).shuffle(docs)
        yield from docs


def mix_seed(seed: int, part: int) -> int:
    """One seed from two (a run's seed and its pass, a pass and a slice, a seed and a worker's rank): the
    one formula every copy of the training stream uses, so a resumed or replayed stream is the same one."""
    return seed * 1_000_003 + part


def iter_slices(corpus: str, heldout_percent: float, split: str, rank: int, world: int, order_seed: int,
                slices: int = 64, doc_prefixes: Sequence[str] = ()) -> Iterator[tuple[int, list[list[str]]]]:
    """(slice number, its documents in corpus order), the slices in a permutation of `order_seed`:
    one scan of the sentences table each. The training stream shuffles inside a slice itself."""
    for part in random.Random(order_seed).sample(range(slices), slices):
        yield part, list(_scan(corpus, heldout_percent, split, rank, world, (part, slices), doc_prefixes))


def _scan(corpus: str, heldout_percent: float, split: str, rank: int, world: int,
          part: Optional[tuple], doc_prefixes: Sequence[str] = ()) -> Iterator[list[str]]:
    cut = int(round(heldout_percent * 100))
    prefixes = tuple(doc_prefixes)
    columns = ["sentence_id", "text"] + (["doc_id"] if prefixes else [])  # doc_id only when it is asked about
    cur_key, cur_sid, run = None, None, []
    for batch in open_sentences(corpus).iter_batches("sentences", columns, batch_size=8192):
        sids = batch.column("sentence_id").to_pylist()
        texts = batch.column("text").to_pylist()
        doc_ids = batch.column("doc_id").to_pylist() if prefixes else None
        for j, (sid, text) in enumerate(zip(sids, texts)):
            key = doc_key_of(sid)
            if key != cur_key or sid != cur_sid + 1:
                if run:
                    yield run
                run = []
                cur_key = key
                b = doc_bucket(key)
                held = b < cut
                keep = split == "all" or (split == "heldout") == held
                if keep and split == "train" and world > 1:
                    keep = (b % world) == rank
                if keep and part is not None:
                    keep = doc_slice(key, part[1]) == part[0]
                if keep and prefixes:
                    keep = (doc_ids[j] or "").startswith(prefixes)
                cur_keep = keep
            cur_sid = sid
            if cur_keep:
                run.append(text or "")
    if run:
        yield run


def windows_of(doc: Sequence[str], k: int) -> Iterator[tuple[list[str], str, list[str]]]:
    for i, s in enumerate(doc):
        yield list(doc[max(0, i - k):i]), s, list(doc[i + 1:i + 1 + k])


def among(cfg) -> str:
    """The document filter of a ContextTrainConfig, for an error message that says why nothing was found."""
    return f" among the documents with doc_id prefixes {cfg.doc_id_prefixes}" if cfg.doc_id_prefixes else ""


def few_documents(corpus: str, cfg) -> str:
    """Why a corpus has no held-out (or training) windows when its documents are few: the split takes whole
    documents (heldout_percent of them, by hash), and a plain-text input file is one document. "" when about 5 or
    more documents are held out (or the count cannot be read): the refusal that asks for it is said either way."""
    from corpus.view import open_corpus

    try:
        n = (open_corpus(corpus).manifest.get("counts") or {}).get("documents")
    except Exception:  # noqa: BLE001 - only a hint to a refusal
        return ""
    if not isinstance(n, int) or n * cfg.heldout_percent / 100 >= 5:
        return ""
    return (f" ({corpus} holds {n} document(s), of which heldout_percent={cfg.heldout_percent} holds out about "
            f"{n * cfg.heldout_percent / 100:.1f}: the split takes whole documents, and a plain-text input file is "
            "one document; give `sentsim corpus build` one file per document, or JSONL with a record per document)")


def no_training_windows(corpus: str, cfg, rank: int, world: int) -> UsageError:
    """The refusal of a worker whose share of the training documents gives no window."""
    return UsageError(f"{corpus}: no training windows{among(cfg)} for worker {rank}/{world} (corpus too small "
                      f"for heldout_percent={cfg.heldout_percent} and {world} workers?){few_documents(corpus, cfg)}")
