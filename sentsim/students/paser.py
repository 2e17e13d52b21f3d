"""PaSeR student: phrase reconstruction plus MLM (../shared/papers/002_*, sections 3.1-3.2).

Inputs: sentence texts (the harvest's `sentences` shards). Each sentence s gets its top-k (3) RAKE
phrases (§3.1.1, `sentsim.students.rake`); the duplicate s~ has them replaced by mask tokens
(§3.1.2); the target is the masked phrases in sentence order, joined by " ; ". A sentence with no
extractable phrase is skipped and counted (`skipped_no_phrase` in the run summary). Optional EDA
(§3.1.3) on s and s~ each step.

Decoding signal (§3.2.2 Eq. 2): [E_s, E_s~, m*|E_s - E_s~|, n*|E_s * E_s~|] with m = n = 10
(appendix A), as a memory of 4 vectors of the encoder's width for a Transformer decoder (§3.2.3,
6 layers by default, word embeddings shared with the encoder, random init). The memory is layer-
normalised over its four vectors together (`paser.signal_norm: joint`), so m and n keep their weight
against E_s; a norm of each vector alone (`per_vector`, how runs made before the joint norm were
built) divides them out, leaving m and n without effect.

Loss (§3.2.4 Eq. 4): L_MLM (15% masking of s, the encoder's masked-LM head) + L_generative
(the teacher-forced decoder's negative log-likelihood of the masked phrases, summed over their tokens as
Eq. 3 writes it and averaged over the batch; `paser.generative_reduction: mean`, a mean over tokens, only
resumes runs built with it).
The decoder and MLM head are training-only: the saved student is the encoder alone.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from sentsim.config import Section
from sentsim.errors import UsageError
from sentsim.losses.phrase_reconstruction import IGNORE, PhraseReconstructionLoss
from sentsim.students.common import Harvest, Objective, Prepared, column, tokenize


class PaSeRConfig(Section):
    top_k: int = Field(3, ge=1)                   # 002 §4.5.3 Table 5: top-3 RAKE phrases
    # No paper fixes it: 002 §3.1.1 takes RAKE's phrases as RAKE splits them (at stopwords and punctuation), of
    # any length. Longer runs are dropped here, since they are mostly lists or names rather than one idea, and a
    # short phrase keeps the decoder's target (top_k phrases joined) within max_target_tokens. Not measured.
    max_phrase_words: int = Field(4, ge=1)
    signal_m: float = Field(10.0, ge=0)           # 002 appendix A: m = n = 10 best (Eq. 2's weights of |.|)
    signal_n: float = Field(10.0, ge=0)           # 002 appendix A, Table 8: n = 10, as m
    # one LayerNorm over the 4 x d memory keeps Eq. 2's m and n against E_s; `per_vector` (a norm per
    # memory vector, which divides m and n out) only resumes runs built with it
    signal_norm: Literal["joint", "per_vector"] = "joint"
    # 002 Eq. 3 sums -log P over the target's tokens (averaged over the batch's examples); `mean` over the
    # batch's real tokens only resumes runs built with it
    generative_reduction: Literal["sum", "mean"] = "sum"
    ADDED_LATER = {"signal_norm": "per_vector", "generative_reduction": "mean"}  # what earlier runs were built with
    decoder_layers: int = Field(6, ge=1)          # 002 §4.2: 6-layer Transformer decoder
    # No paper fixes it (002 §4.2 says only "a 6-layer transformer decoder"): it must divide the encoder's width,
    # and 4 divides both MiniLM's 384 and BERT-base's 768.
    decoder_heads: int = Field(4, ge=1)
    # No paper fixes it (002 §4.2 caps the encoder's input at 32 tokens, not the decoder's target): tokens of the
    # target, its top_k phrases of at most max_phrase_words words joined by " ; ": 3 x 4 words and two separators
    # fit in 24 word pieces unless many words split; a longer target keeps its first tokens. Not measured.
    max_target_tokens: int = Field(24, ge=2)
    mlm_probability: float = Field(0.15, ge=0, lt=1)  # BERT's MLM rate (002 §3.2.4 keeps MLM)
    mlm_weight: float = Field(1.0, ge=0)          # 002 Eq. 4: L_MLM + L_generative
    decoder_lr: float = Field(1e-4, gt=0)         # random-init decoder and MLM head (002 gives no value)
    # EDA (002 §3.1.3, Wei & Zou 2019); probabilities per word
    synonym_replacement: float = Field(0.0, ge=0, le=1)
    # 002 §3.1.3 and Table 4 use it, at a rate 002 does not give; off by default, as in Table 4's "no aug" row
    random_deletion: float = Field(0.0, ge=0, le=1)
    # 002 §3.1.3 and Table 4 use it, at a rate 002 does not give; off by default, as in Table 4's "no aug" row
    token_reordering: float = Field(0.0, ge=0, le=1)


def encoder_width(cfg, backbone: str, backbone_path: str) -> tuple[int, str]:
    """The width of the student encoder's word embeddings (the decoder's), and where it comes from: the scratch
    BERT's scratch.hidden_size, or the backbone's config (its embedding_size where it has one, else hidden_size)."""
    if cfg.init == "scratch":
        return cfg.scratch.hidden_size, "scratch.hidden_size"
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(backbone_path)
    key = "embedding_size" if getattr(config, "embedding_size", None) else "hidden_size"
    return int(getattr(config, key)), f"the {key} of --backbone {backbone}"


@lru_cache(maxsize=4)
def mask_token(backbone_path: str):
    """The backbone tokenizer's mask token (s~ masks the phrases with it), or None: read once per run."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(backbone_path).mask_token


def decoder_signal(e_s: torch.Tensor, e_masked: torch.Tensor, m: float = 10.0, n: float = 10.0) -> torch.Tensor:
    """[B, 4, d]: E_s, E_s~, m*|E_s - E_s~|, n*|E_s * E_s~| (Eq. 2) as 4 memory positions."""
    if e_s.shape != e_masked.shape:
        raise ValueError(f"E_s {tuple(e_s.shape)} and E_s~ {tuple(e_masked.shape)} differ")
    return torch.stack([e_s, e_masked, m * (e_s - e_masked).abs(), n * (e_s * e_masked).abs()], dim=1)


class PhraseDecoder(nn.Module):
    """A small Transformer decoder over the 4-vector signal; input and output embeddings are the
    encoder's word embeddings (shared, §4.2)."""

    def __init__(self, word_embeddings: nn.Embedding, layers: int, heads: int, max_len: int, dropout: float = 0.1,
                 signal_norm: str = "joint"):
        super().__init__()
        d = word_embeddings.embedding_dim
        if d % heads:
            raise ValueError(f"paser.decoder_heads {heads} must divide the encoder width {d}")
        if signal_norm not in ("joint", "per_vector"):
            raise ValueError(f"paser.signal_norm {signal_norm!r}: joint or per_vector")
        self.word_embeddings = word_embeddings  # shared, not a copy
        self.positions = nn.Embedding(max_len, d)
        self.joint_norm = signal_norm == "joint"
        # the memory enters cross-attention unnormalised (norm_first normalises only the queries), so it is
        # normalised here; over all four vectors at once, a norm cannot undo Eq. 2's m and n
        self.signal_norm = nn.LayerNorm(4 * d if self.joint_norm else d)
        layer = nn.TransformerDecoderLayer(d, heads, 4 * d, dropout, batch_first=True, norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, layers)
        self.norm = nn.LayerNorm(d)

    def memory(self, signal: torch.Tensor) -> torch.Tensor:
        """[B, 4, d]: the Eq. 2 signal, layer-normalised jointly (or per vector)."""
        if not self.joint_norm:
            return self.signal_norm(signal)
        return self.signal_norm(signal.flatten(1)).view_as(signal)

    def forward(self, input_ids: torch.Tensor, signal: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.positions(torch.arange(t, device=input_ids.device))[None]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=input_ids.device), diagonal=1)  # True = blocked
        h = self.decoder(x, self.memory(signal.to(x.dtype)), tgt_mask=causal, tgt_key_padding_mask=~pad_mask)
        return self.norm(h) @ self.word_embeddings.weight.T


class PaSeRObjective(Objective):
    settings = PaSeRConfig
    needs_data = "its sentences"
    full_batches = False  # each row's loss is its own (no in-batch negatives): a short last batch is trained on

    @classmethod
    def check(cls, cfg, backbone: str, backbone_path: str) -> None:
        if mask_token(backbone_path) is None:
            raise UsageError(f"--backbone {backbone}: its tokenizer has no mask token; PaSeR needs one")
        # PhraseDecoder's attention splits the word embeddings' width among its heads: refused here, not when a
        # worker builds the decoder after the run went ahead
        width, whose = encoder_width(cfg, backbone, backbone_path)
        heads = cfg.paser.decoder_heads
        if width % heads:
            raise UsageError(f"paser.decoder_heads {heads} must divide the encoder width {width} ({whose}); "
                             f"set paser.decoder_heads to a divisor of {width}")

    @classmethod
    def prepare(cls, cfg, harvest: Harvest) -> Prepared:
        """(text, masked, target) rows from the harvest's distinct sentences (sentsim.students.data.paser_examples)."""
        from sentsim.students import data as D
        from sentsim.surrogate.data import training_note

        texts = D.read_table(harvest.root, "sentences", ["text"])["text"].to_pylist()
        table, info = D.paser_examples(texts, mask_token(harvest.backbone), cfg.paser.top_k,
                                       cfg.paser.max_phrase_words)
        print(training_note(info["sentences"], len(texts), "sentences",
                            {"repeated texts": info["repeated"], "without a RAKE phrase": info["skipped_no_phrase"]}))
        return Prepared(table, {"sentences": info["sentences"]},
                        {"no_phrase": {"count": info["skipped_no_phrase"], "examples": info["skipped_examples"]}})

    @classmethod
    def build(cls, cfg, backbone: str, init: str, spec: dict) -> "PaSeRObjective":
        """The encoder inside a masked-LM model: the MLM head is trained beside it (Eq. 4's L_MLM)."""
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

        from sentsim.training.encoder_models import SiameseSurrogate
        from sentsim.training.encoders import resolve_backbone

        p = resolve_backbone(backbone)
        tok = AutoTokenizer.from_pretrained(str(p))
        if tok.mask_token is None:
            raise UsageError(f"--backbone {backbone}: its tokenizer has no mask token; PaSeR needs one")
        torch.manual_seed(cfg.seed)
        if init == "scratch":
            s = cfg.scratch
            mlm = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=s.hidden_size,
                                             num_hidden_layers=s.num_layers, num_attention_heads=s.num_heads,
                                             intermediate_size=s.intermediate_size,
                                             pad_token_id=tok.pad_token_id or 0))
        else:
            mlm = AutoModelForMaskedLM.from_pretrained(str(p))  # the MLM head is new if the checkpoint lacks it
        head = getattr(mlm, "cls", None) or getattr(mlm, "lm_head", None)
        if head is None:
            raise UsageError(f"--backbone {backbone}: no masked-LM head class for {type(mlm).__name__}")
        return cls(SiameseSurrogate(mlm.base_model, cfg.pooling), tok, cfg, head)

    def __init__(self, model, tok, cfg, mlm_head: nn.Module):
        super().__init__(model, tok, cfg)
        pc = cfg.paser
        self.mlm_head = mlm_head
        emb = model.encoder.get_input_embeddings()
        self.decoder = PhraseDecoder(emb, pc.decoder_layers, pc.decoder_heads, pc.max_target_tokens,
                                     signal_norm=pc.signal_norm)
        self.gen_loss = PhraseReconstructionLoss(pc.generative_reduction)
        self._rng = np.random.default_rng(cfg.seed)
        self.synonyms = None
        if pc.synonym_replacement > 0:
            from sentsim.students.augment import EmbeddingSynonyms

            self.synonyms = EmbeddingSynonyms(tok, emb.weight)

    def param_groups(self, lr: float) -> list[dict]:
        enc = {id(p) for p in self.model.parameters()}
        extra = [p for p in list(self.decoder.parameters()) + list(self.mlm_head.parameters())
                 if id(p) not in enc and p.requires_grad]
        return super().param_groups(lr) + [{"params": extra, "lr": self.cfg.paser.decoder_lr}]

    def _augment(self, texts):
        from sentsim.students.augment import eda

        pc = self.cfg.paser
        if not (pc.synonym_replacement or pc.random_deletion or pc.token_reordering):
            return texts
        return [eda(t, self._rng, self.tok.mask_token, pc.synonym_replacement, pc.random_deletion,
                    pc.token_reordering, self.synonyms) for t in texts]

    def _mlm_inputs(self, enc: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """BERT masking: 15% of the real tokens; of those 80% [MASK], 10% random, 10% kept."""
        ids = enc["input_ids"].clone()
        labels = ids.clone()
        special = torch.zeros_like(ids, dtype=torch.bool)
        for sid in self.tok.all_special_ids:
            special |= ids == sid
        g = torch.Generator().manual_seed(int(self._rng.integers(1 << 31)))
        prob = torch.rand(ids.shape, generator=g).to(ids.device)
        picked = (prob < self.cfg.paser.mlm_probability) & ~special & enc["attention_mask"].bool()
        labels[~picked] = IGNORE
        r = torch.rand(ids.shape, generator=g).to(ids.device)
        ids[picked & (r < 0.8)] = self.tok.mask_token_id
        rand = picked & (r >= 0.8) & (r < 0.9)
        ids[rand] = torch.randint(len(self.tok), ids.shape, generator=g).to(ids.device)[rand]
        return ids, labels

    def _targets(self, targets, device):
        pc = self.cfg.paser
        body = self.tok([str(t) for t in targets], add_special_tokens=False, truncation=True,
                        max_length=pc.max_target_tokens - 1)["input_ids"]
        t = max(len(b) for b in body) + 1
        inp = torch.full((len(body), t), self.tok.pad_token_id, dtype=torch.long)
        lab = torch.full((len(body), t), IGNORE, dtype=torch.long)
        start = self.tok.cls_token_id if self.tok.cls_token_id is not None else self.tok.bos_token_id
        end = self.tok.sep_token_id if self.tok.sep_token_id is not None else self.tok.eos_token_id
        for i, b in enumerate(body):
            inp[i, :len(b) + 1] = torch.tensor([start] + b)
            lab[i, :len(b) + 1] = torch.tensor(b + [end])
        return inp.to(device), lab.to(device), (lab != IGNORE).to(device)

    def step(self, batch: dict, device):
        pc = self.cfg.paser
        texts = self._augment([str(x) for x in column(batch, "text")])
        masked = self._augment([str(x) for x in column(batch, "masked")])
        n = len(texts)
        enc = tokenize(self.tok, texts + masked + texts, self.cfg.max_seq_length, device)
        mlm_ids, mlm_labels = self._mlm_inputs({k: v[2 * n:] for k, v in enc.items()})
        enc["input_ids"] = torch.cat([enc["input_ids"][:2 * n], mlm_ids])
        out = self.model.encoder(**enc)
        from sentsim.training.encoders import pool

        pooled = pool(out.last_hidden_state[:2 * n], enc["attention_mask"][:2 * n], self.cfg.pooling)
        signal = decoder_signal(pooled[:n], pooled[n:], pc.signal_m, pc.signal_n)
        inp, lab, pad = self._targets(column(batch, "target"), device)
        l_gen = self.gen_loss(self.decoder(inp, signal, pad), lab)
        loss = l_gen
        metrics = {"l_generative": float(l_gen.detach())}
        if pc.mlm_weight > 0 and bool((mlm_labels != IGNORE).any()):
            logits = self.mlm_head(out.last_hidden_state[2 * n:])
            l_mlm = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), mlm_labels.reshape(-1),
                                                ignore_index=IGNORE)
            loss = loss + pc.mlm_weight * l_mlm
            metrics["l_mlm"] = float(l_mlm.detach())
        return loss, metrics
