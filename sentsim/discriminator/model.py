"""The coherence discriminator of paper 003 §3.2.1 with an interaction head.

Backbone (as in the paper): a single-layer bidirectional LSTM, hidden size 300; a sentence is
the concatenation of the last forward state and the last backward state (D = 600). Every
sentence is encoded on its own, so the representations of all corpus sentences can be cached
once and screening never runs the LSTM on context sentences again.

Why not Eq. 1 as printed. p = sigmoid(h^T [h_<i, h_i, h_>i]) is linear in the concatenation,
so the logit splits into a·h_<i + b·h_i + c·h_>i. For a fixed sentence s the term b·h_s is
the same for every candidate context, and the order of contexts is decided by a·h_<i + c·h_>i
alone: every sentence would get the same ranking of contexts, and screening could not select
contexts that fit s. The head therefore lets the sentence interact with its contexts:

    l = tanh(W_l [h_{i-w} .. h_{i-1}]),  r = tanh(W_r [h_{i+1} .. h_{i+w}]),  v = tanh(W_s h_i)
    g(c)  = MLP([l, r, l*r])                       context-only coherence
    logit = g(c) + p(v) + l^T diag(a) v + r^T diag(b) v + a_l cos(h_<i, h_i) + a_r cos(h_>i, h_i)

(cos against the unit mean of each side's unit reps). Everything that depends on the context
only (g, l, r, the side directions) is computed from cached sentence reps once per corpus
position; everything that depends on the sentence only (p, v, its unit rep) once per query;
per candidate the work is O(d + D) dot products, the "last layer only" cost the paper asks
for. The bilinear and cosine terms make the ranking depend on s.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from sentsim.config import Section


class ModelConfig(Section):
    # w sentences on each side of the centre sentence (paper 003 §3.2.1 scores [c_<i, c_i, c_>i]); 1 keeps it fast
    # enough for screening.
    window: int = Field(1, ge=1, le=16)
    # No paper fixes it (003 §3.2.1 gives only the LSTM's hidden size): 300, the hidden size and the usual size of
    # word vectors (GloVe, word2vec). Not measured.
    embed_dim: int = Field(300, ge=1)
    # Paper 003 §3.2.1: single-layer BiLSTM, hidden size 300.
    hidden: int = Field(300, ge=1)
    # The interaction head is not in 003 (Eq. 1 is linear; model.py says why it is needed), so no paper sizes
    # it: 256, below the 600-wide sentence representation, keeps screening's per-candidate dot products cheap.
    head_dim: int = Field(256, ge=1)
    # No paper fixes it (003 does not say how its discriminator truncates): words kept per sentence. 64 keeps the
    # whole of most prose sentences and bounds the LSTM's cost for the few long ones (a corpus keeps up to 200).
    # Not measured.
    max_tokens: int = Field(64, ge=1)
    # No paper fixes the vocabulary (003 does not say): the 50,000 most frequent words that occur at least
    # `min_count` times; the rest are one unknown token. Not measured.
    vocab_size: int = Field(50_000, ge=4)
    # No paper fixes it (003 does not say): 2 drops words seen once, whose vectors one sentence alone would train.
    min_count: int = Field(2, ge=1)
    # No paper fixes it (003 does not say): 0.1 on the word vectors, a common rate. Not measured.
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    # "lsa": initial word vectors from an SVD of the corpus's sentence x word TF-IDF (embed_init.py).
    embed_init: Literal["lsa", "random"] = "lsa"


class SentenceEncoder(nn.Module):
    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.embed_dim, padding_idx=0)
        self.lstm = nn.LSTM(cfg.embed_dim, cfg.hidden, num_layers=1, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(cfg.dropout)
        # Forget-gate bias 1 (on each of the two bias vectors): with the default 0 a fresh LSTM
        # forgets half its state per token, and its last state only sees the last few words.
        H = cfg.hidden
        with torch.no_grad():
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias"):
                    p[H:2 * H].fill_(1.0)

    @property
    def dim(self) -> int:
        return 2 * self.lstm.hidden_size

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """tokens [n, T] (0-padded), lengths [n] >= 1 -> reps [n, 2*hidden]."""
        x = self.drop(self.embed(tokens))
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h, _) = self.lstm(packed)  # h: [2, n, hidden], forward last state then backward last state
        return torch.cat([h[0], h[1]], dim=-1)


class InteractionHead(nn.Module):
    """Scores a sentence in a context from cached sentence reps; see the module docstring.

    A context is projected once (`project_context`, cacheable per corpus position) and a
    sentence once (`project_sentence`); `score_projected` is the only per-(sentence, context)
    work, O(d + D) per candidate.
    """

    def __init__(self, rep_dim: int, cfg: ModelConfig):
        super().__init__()
        w, d = cfg.window, cfg.head_dim
        self.window, self.d, self.D = w, d, rep_dim
        self.left = nn.Linear(w * rep_dim, d)
        self.right = nn.Linear(w * rep_dim, d)
        self.sent = nn.Linear(rep_dim, d)
        self.ctx_mlp = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(3 * d, d), nn.ReLU(), nn.Linear(d, 1))
        self.sent_prior = nn.Linear(d, 1)
        # diagonal bilinear forms l^T diag(a) v and r^T diag(b) v
        self.bil_left = nn.Parameter(torch.full((d,), 1.0 / d ** 0.5))
        self.bil_right = nn.Parameter(torch.full((d,), 1.0 / d ** 0.5))
        # Direct weights on cos(left, s) and cos(right, s) of the raw reps. Positive at the start
        # (the prior that a sentence shares its neighbours' words), learned afterwards; this is
        # what makes a short CPU training useful.
        self.cos_weight = nn.Parameter(torch.full((2,), 4.0))
        # Start the three projections in one shared space (left/right = the sentence projection
        # averaged over the w positions), so that the bilinear terms measure similarity at once.
        with torch.no_grad():
            tiled = self.sent.weight.repeat(1, w) / w
            self.left.weight.copy_(tiled)
            self.right.weight.copy_(tiled)
            self.left.bias.copy_(self.sent.bias)
            self.right.bias.copy_(self.sent.bias)

    @property
    def context_core_dim(self) -> int:
        return 1 + 2 * self.d

    def project_context_core(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """left, right [m, w, D] -> [m, 1 + 2d]: context-only score g(c), l, r."""
        lproj = torch.tanh(self.left(left.flatten(1)))
        r = torch.tanh(self.right(right.flatten(1)))
        g = self.ctx_mlp(torch.cat([lproj, r, lproj * r], dim=-1))
        return torch.cat([g, lproj, r], dim=-1)

    @staticmethod
    def side_direction(unit_reps: torch.Tensor) -> torch.Tensor:
        """[m, w, D] unit-normalised reps of one side -> [m, D] unit mean direction."""
        return nn.functional.normalize(unit_reps.mean(1), dim=-1)

    def project_context(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """left, right [m, w, D] (reps in document order) -> context features [m, 1 + 2d + 2D]."""
        core = self.project_context_core(left, right)
        ln = self.side_direction(nn.functional.normalize(left, dim=-1))
        rn = self.side_direction(nn.functional.normalize(right, dim=-1))
        return torch.cat([core, ln, rn], dim=-1)

    def project_sentence(self, h: torch.Tensor) -> torch.Tensor:
        """h [m, D] -> sentence features [m, 1 + d + D]: prior, v, the unit rep."""
        v = torch.tanh(self.sent(h))
        return torch.cat([self.sent_prior(v), v, nn.functional.normalize(h, dim=-1)], dim=-1)

    def score_projected(self, ctx: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
        """ctx [m, 1+2d+2D]; sent [m, 1+d+D] or [1, 1+d+D] -> logits [m]."""
        d, D = self.d, self.D
        g, lproj, r = ctx[:, 0], ctx[:, 1:1 + d], ctx[:, 1 + d:1 + 2 * d]
        ln, rn = ctx[:, 1 + 2 * d:1 + 2 * d + D], ctx[:, 1 + 2 * d + D:]
        p, v, hn = sent[:, 0], sent[:, 1:1 + d], sent[:, 1 + d:]
        qa, qb = v * self.bil_left, v * self.bil_right
        inter = (lproj * qa).sum(-1) + (r * qb).sum(-1)
        cos = self.cos_weight[0] * (ln * hn).sum(-1) + self.cos_weight[1] * (rn * hn).sum(-1)
        return g + p + inter + cos

    def forward(self, left, centre, right) -> torch.Tensor:
        return self.score_projected(self.project_context(left, right), self.project_sentence(centre))


class CoherenceModel(nn.Module):
    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = SentenceEncoder(vocab_size, cfg)
        self.head = InteractionHead(self.encoder.dim, cfg)

    def forward(self, tokens, lengths, left_idx, centre_idx, right_idx) -> torch.Tensor:
        """Encode the n distinct sentences of a batch once, then score windows that index them:
        left_idx, right_idx [B, w], centre_idx [B] -> logits [B]."""
        reps = self.encoder(tokens, lengths)
        return self.head(reps[left_idx], reps[centre_idx], reps[right_idx])


def pad_batch(seqs: list, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    T = int(lengths.max()) if len(seqs) else 1
    out = torch.full((len(seqs), T), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out, lengths


def count_parameters(model: nn.Module, trainable: Optional[bool] = True) -> int:
    return sum(p.numel() for p in model.parameters() if (p.requires_grad or not trainable))
