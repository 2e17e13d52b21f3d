"""Configuration of `sentsim train student`. Defaults cite the paper section they follow; the keys
every trainer shares (init, epochs, max_steps, workers, GPU, bf16, seed, scratch, ...) come from
sentsim.training.config."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from sentsim.config import Section
from sentsim.training.config import TrainingSection


class RankEncoderConfig(Section):
    temperature: float = Field(0.05, gt=0)        # 004 §3.1 Eq. 1, SimCSE's tau (§4.3 follows the base encoder)
    lambda_train: float = Field(0.05, ge=0)       # 004 §4.3: lambda_train = 0.05 (Eq. 5)
    tau_lower: float = Field(0.5, ge=-1, le=1)    # 004 §4.3: tau_l = 0.5 (Eq. 6)
    tau_upper: float = Field(0.8, ge=-1, le=1)    # 004 §4.3: tau_u = 0.8 (Eq. 6)
    lambda_inf: float = Field(0.1, ge=0, le=1)    # 004 §4.3: lambda_inf = 0.1 (Eq. 7)
    # issue 7: optional regression on the harvested pair scores (003 §3.4's L2), added to Eq. 5's total
    score_weight: float = Field(0.0, ge=0)
    score_batch_size: int = Field(32, ge=1)
    check_sentences: int = Field(8, ge=0)  # stored rank codes re-computed to prove the anchor set (0: skip)
    base_encoder: Optional[str] = None  # expected E1; must be the harvest's rank.encoder (default: theirs)

    @model_validator(mode="after")
    def _order(self):
        if self.tau_lower > self.tau_upper:
            raise ValueError(f"tau_lower {self.tau_lower} > tau_upper {self.tau_upper}")
        return self


class RSEConfig(Section):
    temperature: float = Field(0.05, gt=0)        # 000 Table 4 / appendix D: tau = 0.05
    relation_lr: float = Field(1e-2, gt=0)        # 000 appendix D: relation embeddings lr 1e-2
    # sources (000 §3.2): harvested pairs above a threshold, dropout same-sentence, a user triples file
    context_similar: bool = True
    # harvested scores are Eq. 4 similarities (003 §3.3): cosines and correlations, within [-1, 1]
    score_threshold: float = Field(0.5, ge=-1, le=1)      # harvested score >= this -> (s1, context-similar, s2)
    hard_negative_below: float = Field(0.0, ge=-1, le=1)  # a partner scoring below this: s1's in-relation hard neg.
    same_sent: bool = True                        # 000 §3.2 relation r6 (SimCSE dropout)
    same_sent_max: int = Field(150_000, ge=0)     # 000 §3.2: at most 150K samples for other relations
    triples: Optional[str] = None                 # JSONL/Parquet with s_i, relation, s_j[, hard_negative]
    relations: Optional[list[str]] = None         # allowed relation names for the triples file (None: any)
    # inference (000 §3.3 "How can we use?"): weights over relations; None = the first relation alone
    inference_weights: Optional[dict[str, float]] = None
    grad_cache_chunk: int = Field(0, ge=0)        # >0: gradient caching (Gao et al. 2021a), chunk size per pass


class PaSeRConfig(Section):
    top_k: int = Field(3, ge=1)                   # 002 §4.5.3 Table 5: top-3 RAKE phrases
    max_phrase_words: int = Field(4, ge=1)
    signal_m: float = Field(10.0, ge=0)           # 002 appendix A: m = n = 10 best (Eq. 2's weights of |.|)
    signal_n: float = Field(10.0, ge=0)
    decoder_layers: int = Field(6, ge=1)          # 002 §4.2: 6-layer Transformer decoder
    decoder_heads: int = Field(4, ge=1)
    max_target_tokens: int = Field(24, ge=2)
    mlm_probability: float = Field(0.15, ge=0, lt=1)  # BERT's MLM rate (002 §3.2.4 keeps MLM)
    mlm_weight: float = Field(1.0, ge=0)          # 002 Eq. 4: L_MLM + L_generative
    decoder_lr: float = Field(1e-4, gt=0)         # random-init decoder and MLM head (002 gives no value)
    # EDA (002 §3.1.3, Wei & Zou 2019); probabilities per word
    synonym_replacement: float = Field(0.0, ge=0, le=1)
    random_deletion: float = Field(0.0, ge=0, le=1)
    token_reordering: float = Field(0.0, ge=0, le=1)


class StudentConfig(TrainingSection):
    objective: Literal["rankencoder", "rse", "paser"] = "rankencoder"
    batch_size: int = Field(64, ge=2)             # 004 follows SimCSE (64); 002 §4.2 picks from 32/64/96
    lr: float = Field(3e-5, gt=0)                 # SimCSE / PaSeR §4.2: 3e-5
    warmup_ratio: float = Field(0.0, ge=0, le=1)  # 000 appendix D: no warm-up
    weight_decay: float = Field(0.0, ge=0)        # 000 appendix D: no weight decay
    max_seq_length: int = Field(32, ge=8)         # SimCSE / 000 appendix D / 002 §4.2: 32
    log_every: int = Field(10, ge=1)
    eval_every: int = Field(250, ge=1)            # 000 §4.1 evaluates every 125 steps; checkpoints too
    eval_max_pairs: int = Field(2000, ge=10)
    rankencoder: RankEncoderConfig = RankEncoderConfig()
    rse: RSEConfig = RSEConfig()
    paser: PaSeRConfig = PaSeRConfig()
