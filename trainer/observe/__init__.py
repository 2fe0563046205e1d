"""Observation: what a running job tells the outside, and the runtime profile measured from jobs.

Map: `observer` (`JobObserver`, the hooks; `StepInfo`, `PlanInfo`), `tracking` (`MlflowJobObserver`: a job's MLflow
run), `tracking_sender` (its buffered sender thread) and `logged_model` (its trained model as an MLflow model),
`timeline` (`StepTimeline`: alive, D x P and throughput per step, and its figure), `profile` (`RuntimeProfile`, a
planner input), `calibration` (liveput's cost constants fitted to measured migrations) and `layer_times` (each
layer's time, which the stage cut can balance). Must not touch: decisions, processes.
"""
