"""Hugging Face decoder models (the Llama and GPT-2 families) as parcae training specs — the optional ``parcae[hf]``
extra (transformers).

Owns: `spec` (a `transformers` config → embeddings, each decoder layer as its own `Layer`, final norm + head), the
key map between a Hugging Face checkpoint and the layers (`hf_key`), and the local-weights loader. Must not touch:
the hub (configs and weights are read from local files only), processes.

Each decoder layer is built from the family's own class (`LlamaDecoderLayer`, `GPT2Block`), so the maths is
transformers'; what parcae adds is the cut. Side inputs are recomputed per stage from the activation instead of
sent: the rotary position embeddings from the sequence length, the causal mask by SDPA's `is_causal`. Dropout is
switched off (training must not depend on D x P). Random weights are drawn per layer under parcae's seed, with the
family's normal(0, initializer_range) init; `weights` loads a local ``model.safetensors`` (or a folder of shards)
instead.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Subset

from trainer.config import TrainConfig
from trainer.corpus import corpus
from trainer.runtime.data import StepSampler, TokenWindows
from trainer.runtime.trainspec import Layer, SpecError, TrainSpec
from trainer.runtime.validation import Validation

FAMILIES = ("llama", "gpt2")
#: A Llama-shaped network small enough for a CPU test (~70 k parameters per decoder layer).
TINY_LLAMA: dict[str, Any] = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "vocab_size": 128, "max_position_embeddings": 64}  # fmt: skip
DROPOUTS = ("attention_dropout", "hidden_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "summary_first_dropout")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise SpecError("Hugging Face models need the transformers package; pip install 'parcae[hf]'") from None
    return transformers


def load_config(config: Mapping[str, Any] | str) -> Any:
    """A transformers config from a dict (with "model_type") or a local folder / config.json, dropout off, SDPA
    attention (causal without a mask tensor)."""
    tf = _transformers()
    if isinstance(config, str):
        path = Path(config)
        file = path / "config.json" if path.is_dir() else path
        if not file.is_file():
            raise SpecError(f"config {config!r}: no such config.json; give a local folder or file (no hub access)")
        config = json.loads(file.read_text())
    assert isinstance(config, Mapping)  # a config.json is an object, or its "model_type" check below fails
    fields = dict(config)
    kind = fields.pop("model_type", None)
    if kind not in FAMILIES:
        raise SpecError(f"config: model_type {kind!r} is not supported; choose one of {', '.join(FAMILIES)}")
    cfg = tf.AutoConfig.for_model(kind, **fields)
    for name in DROPOUTS:
        if hasattr(cfg, name):
            setattr(cfg, name, 0.0)
    cfg._attn_implementation = "sdpa"
    return cfg


def _init(module: nn.Module, std: float) -> nn.Module:
    """The families' own init (normal(0, initializer_range) weights, zero biases, unit norms), drawn from torch's
    generator as parcae seeded it for this layer."""
    with torch.no_grad():
        for m in module.modules():
            weight, bias = getattr(m, "weight", None), getattr(m, "bias", None)
            if not isinstance(weight, nn.Parameter):
                continue
            if isinstance(m, (nn.Linear, nn.Embedding)) or type(m).__name__ == "Conv1D":
                weight.normal_(0.0, std)
            elif weight.dim() == 1:  # a norm's scale
                weight.fill_(1.0)
            if isinstance(bias, nn.Parameter):
                bias.zero_()
    return module


class LlamaEmbed(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed_tokens(ids)
        return out


class LlamaLayer(nn.Module):
    """One `LlamaDecoderLayer`; the rotary embeddings (no parameters) are recomputed from the sequence length."""

    def __init__(self, cfg: Any, index: int) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        self.layer = LlamaDecoderLayer(cfg, index)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        out: torch.Tensor = self.layer(h, position_embeddings=self.rotary(h, positions), position_ids=positions)
        return out


class LlamaHead(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.norm(h))
        return out


class Gpt2Embed(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.n_positions, cfg.n_embd)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        return out


class Gpt2Layer(nn.Module):
    def __init__(self, cfg: Any, index: int) -> None:
        super().__init__()
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        self.layer = GPT2Block(cfg, layer_idx=index)  # type: ignore[no-untyped-call]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.layer(h)
        first: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return first


class Gpt2Head(nn.Module):
    """The final LayerNorm and an untied head (a tied one would couple the first and the last stage)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.ln_f(h))
        return out


def hf_key(family: str, layer: str, key: str) -> str:
    """The Hugging Face checkpoint key of parameter `key` of parcae layer `layer` ("embed", "layers.3", "head")."""
    if family == "llama":
        if layer == "embed":
            return f"model.{key}"
        if layer == "head":
            return key if key.startswith("lm_head.") else f"model.{key}"
        return f"model.{layer}.{key.removeprefix('layer.')}"
    if layer == "embed":
        return f"transformer.{key}"
    if layer == "head":
        return key if key.startswith("lm_head.") else f"transformer.{key}"
    return f"transformer.h.{layer.removeprefix('layers.')}.{key.removeprefix('layer.')}"


def _read_weights(weights: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = Path(weights)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise SpecError(f"weights {weights!r}: no .safetensors file there; give a local file or folder")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def spec(config: Mapping[str, Any] | str | None = None, tokens: str | None = None, token_dtype: str = "uint16",
         block_size: int = 32, weights: str | None = None, lr: float = 3e-4, dtype: str = "float32",
         data_seed: int = 0, autocast: str | None = None, holdout: float = 0.0, validate_every: int = 100,
         patience: int | None = None, min_delta: float = 0.0, *, train: TrainConfig) -> TrainSpec:  # fmt: skip
    """A decoder from `config` (a dict with "model_type", or a local folder; default `TINY_LLAMA`), trained on
    next-token windows of `block_size` from a `tokens` file (default: the bundled character corpus),
    `train.global_batch` windows per step, AdamW at `lr`; `weights` starts from a local safetensors checkpoint
    instead of random weights; `autocast` "bfloat16" or "float16" (a V100's: the loss is then scaled) runs the
    layers under torch.autocast; `holdout` (a share, e.g. 0.05): the last windows are never trained on, and their
    mean loss is measured every `validate_every` steps and at the end; with `patience`, the job stops once it has not
    improved by more than `min_delta` for that many measurements (`Validation.patience`)."""
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout {holdout!r} must be a share of the windows in [0, 1)")
    cfg = load_config(TINY_LLAMA if config is None else config)
    family, dt, n = cfg.model_type, getattr(torch, dtype), cfg.num_hidden_layers
    std = float(getattr(cfg, "initializer_range", 0.02))
    parts = {"llama": (LlamaEmbed, LlamaLayer, LlamaHead), "gpt2": (Gpt2Embed, Gpt2Layer, Gpt2Head)}[family]
    names = ["embed", *(f"layers.{i}" for i in range(n)), "head"]
    state = _read_weights(weights) if weights is not None else None
    if state is not None and family == "gpt2" and "lm_head.weight" not in state:
        state["lm_head.weight"] = state["transformer.wte.weight"]  # GPT-2 ties it: parcae's head gets a copy

    def build(i: int) -> nn.Module:
        module = parts[0](cfg) if i == 0 else parts[2](cfg) if i == n + 1 else parts[1](cfg, i - 1)
        module = _init(module, std).to(dt)
        if state is not None:
            wanted = {k: hf_key(family, names[i], k) for k in module.state_dict()}
            missing = [v for v in wanted.values() if v not in state]
            if missing:
                raise ValueError(f"weights {weights!r} lack {missing[:3]} for layer {names[i]!r}")
            if not any(p.is_meta for p in module.parameters()):  # on meta (parcae's checks) there is nothing to fill
                module.load_state_dict({k: state[v].to(dt) for k, v in wanted.items()})
        return module

    if tokens is None:
        ids = corpus().tokens
        if cfg.vocab_size < corpus().vocab_size:
            raise SpecError(f"vocab_size {cfg.vocab_size} < the corpus' {corpus().vocab_size} characters; give a "
                             "tokens file or a larger vocab_size")  # fmt: skip
        windows: Any = torch.utils.data.TensorDataset(*_windows(ids, block_size))
    else:
        windows = TokenWindows(tokens, block_size, dtype=token_dtype)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:  # a SUM over rows of per-row means
        if logits.dtype in (torch.float16, torch.bfloat16):  # the softmax in float32, as transformers does
            logits = logits.float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / targets.shape[1]

    held = int(len(windows) * holdout)
    trained = Subset(windows, range(len(windows) - held)) if held else windows
    return TrainSpec(
        layers=[Layer(name, functools.partial(build, i)) for i, name in enumerate(names)],
        batch=StepSampler(trained, train.global_batch, seed=data_seed),
        loss=loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr, betas=train.betas, weight_decay=train.weight_decay),
        autocast=autocast,
        validation=Validation.over(
            Subset(windows, range(len(windows) - held, len(windows))),
            train.global_batch,
            every=validate_every,
            patience=patience,
            min_delta=min_delta,
        )
        if held
        else None,
    )


def _windows(ids: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = (len(ids) - 1) // block_size
    x = ids[: n * block_size].view(n, block_size)
    y = ids[1 : n * block_size + 1].view(n, block_size)
    return x, y


#: The face's name for `spec` (``parcae.hf_decoder``), for a user's spec function that builds on it.
hf_decoder = spec
