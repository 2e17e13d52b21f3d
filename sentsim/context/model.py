"""The seq2seq context model: a `transformers` encoder-decoder plus sentence-position embeddings.

`ContextModel` wraps either
  * `BartForConditionalGeneration` built from `ContextModelConfig` (arch="bart"), or
  * `EncoderDecoderModel` whose encoder and decoder start from a BERT-style checkpoint, with new
    cross-attention (arch="warm_start"; the checkpoint's WordPiece tokenizer is then used),
and adds a sentence-position embedding (which sentence of the window a token belongs to, paper §3.2.2) to
the token embeddings before the model adds its own token-position embeddings.

A batch is padded (one example a row; `src_mask` [B, S] is 1 at real source tokens) or packed (several
examples back to back in a row, `pack_tokens`; arch=bart only): then `src_mask` is [B, S + T], each
source token's segment id (1, 2, ... for the row's examples, 0 = padding) followed by each decoder
token's, and every example sees only itself, as T5 packs examples with segment ids: encoder attention
within a segment, decoder attention causal within a segment, cross-attention to the same segment's
source, token positions from 0 in each example. With sdpa or eager attention the masks are dense
[B, 1, Q, K] tensors, correct everywhere but computed in full; with FlexAttention (`use_attention("flex")`,
training's `attention: flex`) they are block masks built from the same segment ids, and the kernel skips the
blocks where no query of one example meets a key of it.

On disk (a *bundle*, written by `save_bundle`):

    context.json             format, ContextModelConfig, tokenizer SHA-256, direction -> model directory
    tokenizer.json           + tokenizer_roles.json
    models/<name>/           save_pretrained() output (config.json, model.safetensors)
                             + sentence_positions.safetensors
    sentsim_model.json       every file above and its size (sentsim.model_swap: a save replaces a bundle whole)

Weights are only ever read from safetensors; nothing is unpickled.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from sentsim.bundled_model import default_base_encoder
from sentsim.context.bundle_meta import FORMAT, read_bundle_meta
from sentsim.context.config import DIRECTIONS, ContextModelConfig
from sentsim.context.tokenizer import ContextTokenizer, seq2seq_from_checkpoint, wordpiece_from_checkpoint
from sentsim.errors import UsageError

# the names training's `attention` takes -> transformers' attention implementations
ATTENTION_IMPLEMENTATIONS = {"sdpa": "sdpa", "eager": "eager", "flex": "flex_attention"}

try:  # progress bars of save/load are noise in job logs
    from transformers.utils import logging as _hf_logging

    _hf_logging.disable_progress_bar()
except Exception:  # pragma: no cover
    pass


def default_warm_start_path() -> str:
    return default_base_encoder("model.arch=warm_start needs model.warm_start_path then")


class ContextModel(nn.Module):
    def __init__(self, seq2seq: nn.Module, cfg: ContextModelConfig, hidden: int, zero_init: bool):
        super().__init__()
        self.seq2seq = seq2seq
        self.cfg = cfg
        self.n_slots = 2 * cfg.context_sentences + 2
        self.sentence_positions = nn.Embedding(self.n_slots, hidden)
        if zero_init:
            nn.init.zeros_(self.sentence_positions.weight)
        else:
            nn.init.normal_(self.sentence_positions.weight, std=0.02)
        self._enc_emb = seq2seq.get_encoder().get_input_embeddings()
        self.frozen_encoder = False
        self._dec_emb = seq2seq.get_decoder().get_input_embeddings()
        # BART's encoder and decoder take no position ids: packed rows set theirs through these
        self._positions = {}
        if cfg.arch == "bart":
            for side, module in (("enc", seq2seq.model.encoder), ("dec", seq2seq.model.decoder)):
                self._positions[side] = _PositionOverride(module.embed_positions)

    # -------------------------------------------------------------------------------------------- compute

    def _embed(self, emb: nn.Module, ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        x = emb(ids)
        if self.cfg.sentence_position_embeddings:
            x = x + self.sentence_positions(slots).to(x.dtype)
        return x

    def freeze_encoder(self) -> None:
        """Keep the encoder fixed (used with a warm start): no gradients, no backward through it."""
        self.frozen_encoder = True
        for p in self.seq2seq.get_encoder().parameters():
            p.requires_grad_(False)

    def encode(self, src: torch.Tensor, src_slots: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        if self.frozen_encoder and torch.is_grad_enabled():
            with torch.no_grad():
                return self._encode(src, src_slots, src_mask)
        return self._encode(src, src_slots, src_mask)

    def _encode(self, src, src_slots, src_mask):
        emb = self._embed(self._enc_emb, src, src_slots)
        segments = self._segments(src_mask, src.shape[1])
        if segments is None:
            out = self.seq2seq.get_encoder()(inputs_embeds=emb, attention_mask=src_mask, return_dict=True)
            return out.last_hidden_state
        seg = segments[0]
        with self._positions["enc"].set(segment_positions(seg)):
            out = self.seq2seq.get_encoder()(inputs_embeds=emb, attention_mask=self._mask(seg, seg, False, emb.dtype),
                                             return_dict=True)
        return out.last_hidden_state

    def _segments(self, src_mask: torch.Tensor, src_len: int) -> Optional[tuple]:
        """(source, decoder) segment ids of a packed batch, None for a padded one (see the module doc);
        told apart by shape, so no device sync."""
        if src_mask.shape[-1] == src_len:
            return None
        if self.cfg.arch != "bart":
            raise UsageError("packed examples need model.arch=bart")
        return src_mask[:, :src_len], src_mask[:, src_len:]

    def use_attention(self, name: str) -> None:
        """The attention kernel: "sdpa" (torch's scaled_dot_product_attention, the default), "eager" or "flex"
        (FlexAttention: transformers compiles it on its first call)."""
        impl = ATTENTION_IMPLEMENTATIONS.get(name)
        if impl is None:
            raise UsageError(f"attention must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, not {name!r}")
        if self.seq2seq.config._attn_implementation != impl:
            self.seq2seq.set_attn_implementation(impl)

    def _mask(self, q_seg: torch.Tensor, k_seg: torch.Tensor, causal: bool, dtype):
        """The attention mask of packed rows in the model's attention's format: a [B, 1, Q, K] tensor, or a
        FlexAttention block mask of the same rule."""
        impl = self.seq2seq.config._attn_implementation
        if impl == "flex_attention":
            return segment_block_mask(q_seg, k_seg, causal)
        allowed = segment_mask(q_seg, k_seg, causal)
        if impl == "sdpa":
            return allowed
        if impl == "eager":
            return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
                ~allowed, torch.finfo(dtype).min)
        raise UsageError(f"packed examples need sdpa, eager or flex attention, not {impl}")

    def decode(self, enc: torch.Tensor, src_mask: torch.Tensor, dec_in: torch.Tensor,
               dec_slots: torch.Tensor) -> torch.Tensor:
        """Logits for every decoder position (teacher forcing). Decoder inputs are right-padded, so the
        causal mask alone keeps padding out of every real position."""
        if self._segments(src_mask, enc.shape[1]) is not None:
            return self.project(self.decoder_states(enc, src_mask, dec_in, dec_slots))
        out = self.seq2seq(
            encoder_outputs=(enc,),
            attention_mask=src_mask,
            decoder_inputs_embeds=self._embed(self._dec_emb, dec_in, dec_slots),
            use_cache=False,
            return_dict=True,
        )
        return out.logits

    def forward(self, src, src_slots, src_mask, dec_in, dec_slots):
        return self.decode(self.encode(src, src_slots, src_mask), src_mask, dec_in, dec_slots)

    def decoder_states(self, enc: torch.Tensor, src_mask: torch.Tensor, dec_in: torch.Tensor,
                       dec_slots: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden states [B, T, H]: `decode` without the vocabulary projection, which
        `project` then applies to the positions that are scored only."""
        emb = self._embed(self._dec_emb, dec_in, dec_slots)
        segments = self._segments(src_mask, enc.shape[1])
        if segments is not None:
            src_seg, dec_seg = segments
            with self._positions["dec"].set(segment_positions(dec_seg)):
                out = self.seq2seq.model.decoder(
                    inputs_embeds=emb, attention_mask=self._mask(dec_seg, dec_seg, True, emb.dtype),
                    encoder_hidden_states=enc, encoder_attention_mask=self._mask(dec_seg, src_seg, False, emb.dtype),
                    use_cache=False, return_dict=True)
            return out.last_hidden_state
        if self.cfg.arch == "bart":
            body = self.seq2seq.model.decoder
        else:  # EncoderDecoderModel: its BERT decoder without the LM head, as its forward calls it
            body = self.seq2seq.decoder.base_model
            dec_cfg = self.seq2seq.decoder.config
            if (self.seq2seq.encoder.config.hidden_size != dec_cfg.hidden_size
                    and getattr(dec_cfg, "cross_attention_hidden_size", None) is None):
                enc = self.seq2seq.enc_to_dec_proj(enc)
        out = body(inputs_embeds=emb, encoder_hidden_states=enc, encoder_attention_mask=src_mask, use_cache=False,
                   return_dict=True)
        return out.last_hidden_state

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits of decoder states ([..., H] -> [..., V]), as the seq2seq model's own head."""
        if self.cfg.arch == "bart":
            logits = self.seq2seq.lm_head(hidden)
            return logits + self.seq2seq.final_logits_bias.to(logits.dtype)
        return self.seq2seq.decoder.cls(hidden)

    def target_logits(self, src, src_slots, src_mask, dec_in, dec_slots, labels) -> tuple:
        """(logits [N, V], targets [N]) of the N target positions (labels >= 0, row by row): the
        vocabulary projection and the loss see no padded position, and no [B, T, V] tensor is made."""
        hidden = self.decoder_states(self.encode(src, src_slots, src_mask), src_mask, dec_in, dec_slots)
        keep = labels >= 0
        return self.project(hidden[keep]), labels[keep]

    def n_parameters(self) -> int:
        seen, n = set(), 0
        for p in self.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    # -------------------------------------------------------------------------------------------- disk

    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.seq2seq.save_pretrained(str(d))
        save_file({"weight": self.sentence_positions.weight.detach().cpu().contiguous()},
                  str(d / "sentence_positions.safetensors"))

    @classmethod
    def load(cls, directory: str | Path, cfg: ContextModelConfig, tok: ContextTokenizer) -> "ContextModel":
        d = Path(directory)
        if not (d / "config.json").is_file():
            raise UsageError(f"{d}: not a saved context model (no config.json)")
        if cfg.arch == "bart":
            from transformers import BartForConditionalGeneration as Cls
        else:
            from transformers import EncoderDecoderModel as Cls
        seq2seq = Cls.from_pretrained(str(d), use_safetensors=True)
        hf_vocab = _vocab_size(seq2seq)
        if hf_vocab < tok.vocab_size:
            raise UsageError(f"{d}: model vocabulary ({hf_vocab}) is smaller than its tokenizer's ({tok.vocab_size})")
        hidden = _hidden_size(seq2seq)
        if cfg.arch == "bart" and not cfg.pretrained_path and hidden != cfg.d_model:
            raise UsageError(f"{d}: model d_model {hidden} does not match context.json d_model {cfg.d_model}")
        m = cls(seq2seq, cfg, hidden, zero_init=True)
        sp = d / "sentence_positions.safetensors"
        if not sp.is_file():
            raise UsageError(f"{d}: missing sentence_positions.safetensors")
        w = load_file(str(sp))["weight"]
        if tuple(w.shape) != tuple(m.sentence_positions.weight.shape):
            raise UsageError(f"{d}: sentence-position table {tuple(w.shape)} does not match the config's window "
                             f"({m.n_slots} slots x {hidden})")
        with torch.no_grad():
            m.sentence_positions.weight.copy_(w)
        return m


class _PositionOverride:
    """Per-token positions for a BART learned-position table, as BART's encoder and decoder take no position
    ids: while `set(positions)` holds, the table is read at `positions` [B, L] instead of 0..L-1 (the table's
    own forward would index past its end on a packed row wider than it). Otherwise its own forward runs."""

    def __init__(self, module: nn.Module):
        self.positions: Optional[torch.Tensor] = None
        self.module, self.own_forward = module, module.forward
        module.forward = self.forward

    def forward(self, *args, **kwargs):
        if self.positions is None:
            return self.own_forward(*args, **kwargs)
        return nn.functional.embedding(self.positions + self.module.offset, self.module.weight)

    @contextmanager
    def set(self, positions: torch.Tensor):
        self.positions = positions
        try:
            yield
        finally:
            self.positions = None


def segment_positions(seg: torch.Tensor) -> torch.Tensor:
    """Each token's position within its own segment ([B, L] ids, a segment's tokens adjacent): 0 at every
    example's first token, as unpacked; 0 at padding (id 0)."""
    idx = torch.arange(seg.shape[1], device=seg.device).expand_as(seg)
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(1).values
    return torch.where(seg > 0, idx - first, torch.zeros_like(idx))


def segment_mask(q_seg: torch.Tensor, k_seg: torch.Tensor, causal: bool) -> torch.Tensor:
    """[B, 1, Q, K] bool, True where a query may attend a key: the same segment (and, `causal`, not a later
    position). A padding query (id 0) attends every key, so no softmax row is empty (a NaN that would reach
    the gradients through the matrix products); its output is never read."""
    same = q_seg[:, :, None] == k_seg[:, None, :]
    if causal:
        q, k = q_seg.shape[1], k_seg.shape[1]
        same = same & torch.ones(q, k, dtype=torch.bool, device=q_seg.device).tril()
    return (same | (q_seg == 0)[:, :, None])[:, None]


def segment_block_mask(q_seg: torch.Tensor, k_seg: torch.Tensor, causal: bool):
    """`segment_mask`'s rule as a FlexAttention BlockMask: the kernel visits only the (query block, key block)
    tiles where some query may attend some key, so the attention between a row's examples costs nothing."""
    from torch.nn.attention.flex_attention import create_block_mask

    def allowed(b, h, q, k):
        qs = q_seg[b, q]
        ok = qs == k_seg[b, k]
        if causal:
            ok = ok & (k <= q)
        return ok | (qs == 0)

    return create_block_mask(allowed, q_seg.shape[0], None, q_seg.shape[1], k_seg.shape[1], device=q_seg.device)


def _vocab_size(seq2seq) -> int:
    c = seq2seq.config
    return c.decoder.vocab_size if hasattr(c, "decoder") and hasattr(c.decoder, "vocab_size") else c.vocab_size


def _hidden_size(seq2seq) -> int:
    c = seq2seq.config
    if hasattr(c, "decoder") and hasattr(c.decoder, "hidden_size"):
        return c.decoder.hidden_size
    return c.d_model


def build_model(cfg: ContextModelConfig, tok: ContextTokenizer, seed: int = 0) -> ContextModel:
    torch.manual_seed(seed)
    if cfg.arch == "bart" and cfg.pretrained_path:
        from transformers import BartForConditionalGeneration

        p = Path(cfg.pretrained_path)
        if not (p / "model.safetensors").is_file():
            raise UsageError(f"{p}: no model.safetensors (pickled checkpoints are not loaded)")
        seq2seq = BartForConditionalGeneration.from_pretrained(str(p), use_safetensors=True)
        if seq2seq.config.vocab_size < tok.vocab_size:
            seq2seq.resize_token_embeddings(tok.vocab_size)
        seq2seq.config.decoder_start_token_id = tok.bos_id
        seq2seq.config.pad_token_id = tok.pad_id
        if max(cfg.max_source_tokens, cfg.max_target_tokens + 1) > seq2seq.config.max_position_embeddings:
            raise UsageError(f"{p}: max_source_tokens/max_target_tokens exceed the checkpoint's "
                             f"{seq2seq.config.max_position_embeddings} positions")
        return ContextModel(seq2seq, cfg, seq2seq.config.d_model, zero_init=True)
    if cfg.arch == "bart":
        from transformers import BartConfig, BartForConditionalGeneration

        hf = BartConfig(
            vocab_size=tok.vocab_size,
            d_model=cfg.d_model,
            encoder_layers=cfg.encoder_layers,
            decoder_layers=cfg.decoder_layers,
            encoder_attention_heads=cfg.attention_heads,
            decoder_attention_heads=cfg.attention_heads,
            encoder_ffn_dim=cfg.ffn_dim,
            decoder_ffn_dim=cfg.ffn_dim,
            dropout=cfg.dropout,
            attention_dropout=0.0,
            activation_dropout=0.0,
            max_position_embeddings=max(cfg.max_source_tokens, cfg.max_target_tokens + 1) + 2,
            pad_token_id=tok.pad_id,
            bos_token_id=tok.bos_id,
            eos_token_id=tok.eos_id,
            decoder_start_token_id=tok.bos_id,
            forced_eos_token_id=None,
            scale_embedding=True,
            tie_word_embeddings=True,
        )
        return ContextModel(BartForConditionalGeneration(hf), cfg, cfg.d_model, zero_init=False)
    # warm start: encoder and decoder from a BERT-style checkpoint, cross-attention new.
    import transformers
    from transformers import EncoderDecoderModel

    path = cfg.warm_start_path or default_warm_start_path()
    if cfg.max_source_tokens > 512 or cfg.max_target_tokens + 1 > 512:
        raise UsageError("warm start: max_source_tokens and max_target_tokens must fit the checkpoint's 512 positions")
    verb = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # "newly initialised cross-attention" is expected here
    try:
        seq2seq = EncoderDecoderModel.from_encoder_decoder_pretrained(
            path, path, encoder_hidden_dropout_prob=cfg.dropout, decoder_hidden_dropout_prob=cfg.dropout
        )
    finally:
        transformers.logging.set_verbosity(verb)
    seq2seq.config.decoder_start_token_id = tok.bos_id
    seq2seq.config.pad_token_id = tok.pad_id
    seq2seq.config.eos_token_id = tok.eos_id
    seq2seq.config.vocab_size = seq2seq.config.decoder.vocab_size
    return ContextModel(seq2seq, cfg, seq2seq.config.decoder.hidden_size, zero_init=True)


def init_cross_attention_from_self(model: ContextModel) -> int:
    """Warm start only: copy every decoder layer's self-attention block (query, key, value, output dense
    and LayerNorm) into the same layer's cross-attention. Returns the number of layers initialised.

    Why: transformers gives an `EncoderDecoderModel` random cross-attention, which perturbs the pretrained
    decoder and must be learned before the source is read at all; a copy of the layer's own pretrained
    attention reads the encoder states (same pretrained model, same space) from the first step."""
    if model.cfg.arch != "warm_start":
        raise UsageError("cross_attention_init=self_attention applies to model.arch=warm_start only")
    n = 0
    with torch.no_grad():
        for layer in model.seq2seq.get_decoder().base_model.encoder.layer:
            cross = getattr(layer, "crossattention", None)
            if cross is None:
                continue
            cross.load_state_dict(layer.attention.state_dict())
            n += 1
    if n == 0:
        raise UsageError("warm-start decoder has no cross-attention layers to initialise")
    return n


def new_parameter_names(model: ContextModel) -> set[str]:
    """Names (in `model.named_parameters()`) of what a warm start adds to the checkpoint: cross-attention,
    the sentence-position table and the LM-head transform. Empty for arch=bart."""
    if model.cfg.arch != "warm_start":
        return set()
    return {n for n, _ in model.named_parameters()
            if "crossattention" in n or n.startswith("sentence_positions") or ".cls.predictions.transform" in n
            or n.endswith(".cls.predictions.bias")}


def warm_start_tokenizer(cfg: ContextModelConfig) -> ContextTokenizer:
    if cfg.arch == "bart" and cfg.pretrained_path:
        return seq2seq_from_checkpoint(cfg.pretrained_path)
    return wordpiece_from_checkpoint(cfg.warm_start_path or default_warm_start_path())


# ------------------------------------------------------------------------------------------------ bundles


def save_bundle(out: str | Path, cfg: ContextModelConfig, tok: ContextTokenizer, models: dict[str, ContextModel],
                directions: dict[str, str], extra: Optional[dict] = None) -> Path:
    """models: name -> model; directions: direction -> name (e.g. all three -> "shared").

    Replaces any bundle in `out` in place (sentsim.model_swap.replace_in_place, context.json its commit
    file), keeping the rest of the folder (a trainer's runs/ and tokenizer/): a kill at any moment leaves
    the old bundle or the new one, whole."""
    from sentsim.model_swap import replace_in_place
    from storage.fs import write_text_atomic

    meta = {
        "format": FORMAT,
        "model_config": cfg.model_dump(),
        "tokenizer_sha256": tok.sha256,
        "vocab_size": tok.vocab_size,
        "directions": {d: f"models/{n}" for d, n in directions.items()},
        **(extra or {}),
    }

    def write(folder: Path) -> None:
        tok.save(folder)
        for name, m in models.items():
            m.save(folder / "models" / name)
        write_text_atomic(str(folder / "context.json"), json.dumps(meta, indent=1, sort_keys=True))

    return replace_in_place(Path(out), "context.json", write, {"format": FORMAT})


def load_bundle(path: str | Path, expect: Optional[ContextModelConfig] = None,
                expect_tokenizer_sha256: Optional[str] = None):
    """-> (ContextModelConfig, ContextTokenizer, {direction: ContextModel}). Refuses a bundle whose
    tokenizer file is not the one its models were trained with, or whose config differs from `expect`."""
    from sentsim.model_swap import resolve_in_place

    path = resolve_in_place(path, "context.json")
    meta = read_bundle_meta(path)
    cfg = ContextModelConfig.model_validate(meta["model_config"])
    tok = ContextTokenizer.load(path)
    if tok.sha256 != meta.get("tokenizer_sha256"):
        raise UsageError(f"{path}: tokenizer.json does not match the tokenizer the models were trained with "
                         f"(sha256 {tok.sha256[:12]} vs {str(meta.get('tokenizer_sha256'))[:12]})")
    if expect_tokenizer_sha256 and tok.sha256 != expect_tokenizer_sha256:
        raise UsageError(f"{path}: its tokenizer ({tok.sha256[:12]}) differs from the other models' "
                         f"({expect_tokenizer_sha256[:12]}); scores from different vocabularies cannot be combined")
    if expect is not None:
        diff = {k: (v, getattr(cfg, k)) for k, v in expect.model_dump().items()
                if k not in ("layout", "dropout") and getattr(cfg, k) != v}
        if diff:
            shown = ", ".join(f"{k}: expected {a!r}, checkpoint has {b!r}" for k, (a, b) in sorted(diff.items()))
            raise UsageError(f"{path}: checkpoint config does not match: {shown}")
    loaded: dict[str, ContextModel] = {}
    out: dict[str, ContextModel] = {}
    for d, rel in meta["directions"].items():
        if d not in DIRECTIONS:
            raise UsageError(f"{path}: unknown direction {d!r} in context.json")
        if rel not in loaded:
            loaded[rel] = ContextModel.load(path / rel, cfg, tok)
        out[d] = loaded[rel]
    return cfg, tok, out
