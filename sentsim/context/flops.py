"""Matrix FLOPs of the context models' passes, counted from the shapes of a batch (for MFU).

A multiply-add is 2 FLOPs. Per layer, for a batch of B rows with source length S and target length T
(padded lengths: the device computes them), with width d, feed-forward width f:

    encoder layer   B * (8 S d^2 + 4 S d f + 4 S^2 d)            projections, feed-forward, attention
    decoder layer   B * (8 T d^2 + 4 T^2 d                        self-attention
                         + 4 T d^2 + 4 S d^2 + 4 T S d            cross-attention (keys/values over S)
                         + 4 T d f)                               feed-forward
    output          P * 2 d V (+ P * 2 d^2 for BERT's transform)  the P scored positions only

Training counts 3x the forward (the backward is about twice it), the encoder 1x when frozen. Attention is
counted in full, as torch.utils.flop_counter counts it (a causal kernel may skip half); the test holds these
counts to within a few % of that counter on both architectures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    d: int
    ffn_enc: int
    ffn_dec: int
    enc_layers: int
    dec_layers: int
    vocab: int
    lm_transform: bool  # BERT's LM head has a dense transform before the vocabulary projection


def model_shape(model) -> Shape:
    """The dimensions of a `ContextModel`'s seq2seq model (BART or a BERT encoder-decoder)."""
    c = model.seq2seq.config
    if hasattr(c, "encoder") and hasattr(c, "decoder"):  # EncoderDecoderModel
        e, dc = c.encoder, c.decoder
        return Shape(dc.hidden_size, e.intermediate_size, dc.intermediate_size, e.num_hidden_layers,
                     dc.num_hidden_layers, dc.vocab_size, True)
    return Shape(c.d_model, c.encoder_ffn_dim, c.decoder_ffn_dim, c.encoder_layers, c.decoder_layers, c.vocab_size,
                 False)


def encoder_flops(m: Shape, rows: int, S: int) -> float:
    return float(m.enc_layers * rows * (8 * S * m.d ** 2 + 4 * S * m.d * m.ffn_enc + 4 * S * S * m.d))


def decoder_flops(m: Shape, rows: int, S: int, T: int, positions: int) -> float:
    d = m.d
    layer = 8 * T * d * d + 4 * T * T * d + 4 * T * d * d + 4 * S * d * d + 4 * T * S * d + 4 * T * d * m.ffn_dec
    head = positions * (2 * d * m.vocab + (2 * d * d if m.lm_transform else 0))
    return float(m.dec_layers * rows * layer + head)


def training_flops(m: Shape, rows: int, S: int, T: int, positions: int, encoder_frozen: bool = False) -> float:
    return (1 if encoder_frozen else 3) * encoder_flops(m, rows, S) + 3 * decoder_flops(m, rows, S, T, positions)
