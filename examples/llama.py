"""A Llama-shaped decoder from a transformers config (``pip install 'parcae[hf]'``), as a parcae training spec.

Each decoder layer is its own pipeline layer, built from transformers' own `LlamaDecoderLayer`; the weights are
random (drawn per layer under parcae's seed) unless `weights` names a local safetensors checkpoint — nothing is read
from the hub. Train it under a replayed trace with

    parcae train --model examples/llama.py:spec --trace p3 --workers 4 --steps 100 --global-batch 8

or give your own config folder and weights: ``--model tiny-llama --model-args '{"config": "path/to/model",
"weights": "path/to/model"}'``, with a token file of the model's tokenizer (`tokens`, `token_dtype`).
"""

from __future__ import annotations

from typing import Any

import parcae

CONFIG = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 6,
          "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 128,
          "max_position_embeddings": 128}  # fmt: skip


def spec(layers: int = 6, block_size: int = 64, tokens: str | None = None, weights: str | None = None,
         dtype: str = "float32", *, train: Any) -> parcae.TrainSpec:  # fmt: skip
    """`train` is the job's TrainConfig (parcae passes it to a spec function that asks): its global batch sets
    the rows per step. Without `tokens`, the windows come from parcae's bundled character corpus."""
    return parcae.hf_decoder({**CONFIG, "num_hidden_layers": layers}, tokens=tokens, block_size=block_size,
                             weights=weights, dtype=dtype, train=train)  # fmt: skip
