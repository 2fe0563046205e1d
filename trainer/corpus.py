"""The bundled character corpus: the text the example GPTs train on, and its vocabulary.

Owns: `Corpus` and `corpus()` (`pydoc_data.topics.topics`, joined in sorted key order; vocabulary = its sorted set
of characters). Must not touch: configs, batches, models — `trainer.config` reads the vocabulary size from here
and `trainer.runtime.data` cuts batches from it, so it imports nothing of the trainer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Corpus:
    """The encoded text (int64 token ids) and its vocabulary."""

    tokens: torch.Tensor
    chars: str

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@functools.lru_cache(maxsize=1)
def corpus() -> Corpus:
    """The bundled corpus (~465 k characters, ~100 distinct), built once per process."""
    from pydoc_data.topics import topics

    text = "".join(topics[k] for k in sorted(topics))
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    tokens = torch.tensor([index[c] for c in text], dtype=torch.long)
    return Corpus(tokens=tokens, chars=chars)
