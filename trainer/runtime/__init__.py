"""The worker's runtime: the model protocol, the pipeline step, migrations' hand-off, checkpoints, the worker — and
the wire it speaks to the coordinator.

Map: `trainspec` (`TrainSpec`, the contract a model is written against: its loader and checks), `model` (the
per-layer build and `Stage`), `data` (the split of a step's global batch), `pipeline` (per-epoch process groups,
`StageLayout`, `train_step`: GPipe + DP all-reduce, all or nothing), `migration` (`Epoch`, the pure planning of
migrations and recoveries, layer-state sizes), `handoff` (a migration's messages and catch-up), `preparation` (what a
worker does for a prepared epoch before its boundary), `checkpoint` (layer-keyed, hashed, atomic), `export` (a
checkpoint as one state dict, or loaded into `spec_model.SpecModel`: the spec's layers as one module), `worker` (one
process per instance), and the wire: `store` (the sealed TCPStore), `keys` (every key), `spec` (`JobSpec`, the
boundary words).
Must not touch: decisions (`trainer.control`), where instances come from (`trainer.providers`), MLflow.
"""
