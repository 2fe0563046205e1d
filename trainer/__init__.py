"""trainer: the elastic D x P trainer that Parcae live-migrates — the CPU demo of the runtime (reference §D.3).

A worker owns a contiguous range of layers by *global layer index*; each layer's parameters and optimiser state
can be extracted and installed on their own (`pipeline.layer_state` / `pipeline.load_layer_state`), which is the
unit intra-stage, inter-stage and pipeline migrations move. Every D x P strategy trains exactly the same run: the
global batch depends only on (seed, step), layers are initialised per layer, and the loss is normalised by the
global batch.

Modules (each a component with a narrow interface; none imports Prefect):
  config      frozen dataclasses: ModelConfig, TrainConfig, the model registry
  data        the bundled character corpus, global_batch(step), shard into replicas and micro-batches
  model       a small GPT as an ordered list of named layers; Stage runs a contiguous slice (no distribution)
  pipeline    Strategy (D x P geometry), per-epoch process groups, StageContext, train_step (GPipe + DP all-reduce)
  checkpoint  layer-keyed checkpoints, atomic writes, safe loads, CheckpointError
"""
