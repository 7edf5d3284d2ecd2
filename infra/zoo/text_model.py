"""The real zoo's text model: a small BERT-style encoder over token sequences derived from
scikit-learn's digits, written here and trained here in seconds (nothing is downloaded).

The token task, derived honestly from the digits: a digit image is read like a sentence in which
every inked pixel is a word. Each pixel with a nonzero intensity becomes one token naming where
it is and how dark it is (``position * INK_LEVELS + level``: 64 positions, intensities 1..16
quantised to 4 levels), in raster order after a CLS-like token; blank pixels are left out, so a
sequence's length is the digit's amount of ink (17..43 tokens here) and each is padded with PAD
up to ``SEQUENCE_LENGTH``, with ``attention_mask`` 1 on real tokens and 0 on padding, as a BERT
input is. The label is the digit.

The model: token embedding + learned position embedding + ``nn.TransformerEncoder`` (pre-norm,
GELU) + a mean over the unmasked positions + a linear head. It takes two int64 inputs,
``input_ids`` and ``attention_mask`` [batch, SEQUENCE_LENGTH], and returns ``logits`` [batch, 10].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

PAD = 0
CLS = 1
FIRST_PIXEL_TOKEN = 2
PIXELS = 64  # an 8x8 digit
INK_LEVELS = 4  # intensities 1..16 in four steps of four
VOCABULARY = FIRST_PIXEL_TOKEN + PIXELS * INK_LEVELS
SEQUENCE_LENGTH = 48  # CLS + at most 43 inked pixels in load_digits, with room to spare
NUM_CLASSES = 10


@dataclass(frozen=True)
class EncoderShape:
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    feedforward: int = 256
    dropout: float = 0.1


def tokenise(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), both int64 [N, SEQUENCE_LENGTH], from digits [N, 8, 8]
    with intensities 0..16."""
    flat = np.asarray(images).reshape(len(images), PIXELS).round().astype(np.int64)
    input_ids = np.full((len(flat), SEQUENCE_LENGTH), PAD, dtype=np.int64)
    attention_mask = np.zeros((len(flat), SEQUENCE_LENGTH), dtype=np.int64)
    for row, pixels in enumerate(flat):
        inked = np.flatnonzero(pixels)
        if len(inked) + 1 > SEQUENCE_LENGTH:
            raise ValueError(f"image {row} has {len(inked)} inked pixels; at most {SEQUENCE_LENGTH - 1} fit")
        levels = (np.clip(pixels[inked], 1, 16) - 1) // (16 // INK_LEVELS)
        tokens = FIRST_PIXEL_TOKEN + inked * INK_LEVELS + levels
        input_ids[row, 0] = CLS
        input_ids[row, 1 : len(tokens) + 1] = tokens
        attention_mask[row, : len(tokens) + 1] = 1
    return input_ids, attention_mask


class DigitsTextEncoder(nn.Module):
    """Token + position embeddings, a TransformerEncoder, a masked mean pool and a linear head."""

    def __init__(self, shape: EncoderShape = EncoderShape()) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(VOCABULARY, shape.d_model, padding_idx=PAD)
        self.position_embedding = nn.Parameter(torch.zeros(1, SEQUENCE_LENGTH, shape.d_model))
        nn.init.normal_(self.position_embedding, std=0.02)
        layer = nn.TransformerEncoderLayer(
            shape.d_model,
            shape.heads,
            shape.feedforward,
            shape.dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        # No nested tensors: they would zero the padded positions only on torch's inference fast
        # path, not in the exported graph; the masked pool below ignores those positions anyway.
        self.encoder = nn.TransformerEncoder(layer, shape.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(shape.d_model)
        self.head = nn.Linear(shape.d_model, NUM_CLASSES)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.token_embedding(input_ids) + self.position_embedding[:, : input_ids.shape[1]]
        hidden = self.encoder(hidden, src_key_padding_mask=attention_mask == 0)
        hidden = self.norm(hidden)
        weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        logits: torch.Tensor = self.head(pooled)
        return logits


@dataclass(frozen=True)
class TrainingReport:
    epochs: int
    seconds: float
    final_loss: float


def train(
    model: DigitsTextEncoder,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    labels: np.ndarray,
    epochs: int,
    seed: int,
    log: Callable[[str], None],
    batch_size: int = 32,
    learning_rate: float = 2e-3,
) -> TrainingReport:
    """Train ``model`` in place (AdamW, one-cycle schedule, cross-entropy) and leave it in eval mode."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    ids, mask, targets = (torch.from_numpy(a) for a in (input_ids, attention_mask, labels))
    steps_per_epoch = -(-len(ids) // batch_size)
    optimiser = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=learning_rate, total_steps=max(1, epochs * steps_per_epoch), pct_start=0.2
    )
    started = time.perf_counter()
    loss_mean = float("nan")
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(ids), generator=generator)
        loss_sum = 0.0
        for start in range(0, len(ids), batch_size):
            index = order[start : start + batch_size]
            optimiser.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(ids[index], mask[index]), targets[index])
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()
            schedule.step()
            loss_sum += float(loss.detach()) * len(index)
        loss_mean = loss_sum / len(ids)
        if epoch == epochs or epoch % max(1, epochs // 4) == 0:
            log(f"epoch {epoch}/{epochs}: loss {loss_mean:.4f} ({time.perf_counter() - started:.1f} s)")
    model.eval()
    return TrainingReport(epochs=epochs, seconds=time.perf_counter() - started, final_loss=loss_mean)
