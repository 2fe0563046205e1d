"""trainer: the elastic D x P trainer that Parcae live-migrates — the CPU demo of the runtime (reference §D.3).

A worker owns a contiguous range of layers by *global layer index*; each layer's parameters and optimiser state
can be extracted and installed on their own (`pipeline.layer_state` / `pipeline.load_layer_state`), which is the
unit intra-stage, inter-stage and pipeline migrations move and checkpoints store. Every D x P strategy trains
exactly the same run: the global batch depends only on (seed, step), layers are initialised per layer, the loss is
normalised by the global batch, and a step is applied all or nothing. So a job that is live-migrated, loses workers
without notice, or is restarted from a checkpoint (its lost steps recomputed) ends with the parameters of one
uninterrupted process.

How the pieces fit: `run.run_job` is the driver — it starts a `coordinator.Coordinator` (the TCPStore, the plan
and the failure detector) and worker processes through an `instances` provider, then applies an `events` schedule
(scripted, from a trace, or random). Each `worker.Worker` trains its stage with `pipeline.train_step` and, at the
step boundaries the coordinator decided, moves layers as the `migration.Epoch` says. When a worker dies (its
process exits, or its heartbeat stops), the coordinator flags the epoch broken, survivors abandon the step in
flight and the coordinator either plans a live migration from them (`migration.plan_recovery`) or the driver runs
a checkpoint-restart from the latest complete periodic `checkpoint`.

Modules (each a component with a narrow interface; none imports Prefect):
  config       frozen dataclasses: ModelConfig, TrainConfig, the model registry
  data         the bundled character corpus, global_batch(step), shard into replicas and micro-batches
  model        a small GPT as an ordered list of named layers; Stage runs a contiguous slice (no distribution)
  pipeline     StageLayout (D x P geometry), per-epoch gloo groups with abortable waits, StageContext, train_step
               (GPipe + DP all-reduce, all-or-nothing commit), StepAbandoned
  checkpoint   layer-keyed checkpoints (any cut), atomic writes, hash records, verified loads, retention
  store        the control plane's store: bound where asked, every client authenticated, values sealed
  keys         the control plane's store keys, one function or constant each, and which only the driver writes
  events       the schedule format: plan, add, preempt (notice), kill (no notice), checkpoint-restart
  migration    Epoch, the pure planning of migrations, recoveries after a kill, and checkpoint-restart epochs
  coordinator  the control plane: the job's spec, membership, heartbeats, boundary decisions, checkpoints, records
  worker       one process per instance: the worker state machine, heartbeat, commit, hand-off, recovery
  instances    InstanceProvider, LocalProcessProvider, trace- and chaos-driven schedules (LocalTraceProvider)
  agent        InstanceAgent (runs an instance's worker for a driver elsewhere), AgentInstances (the driver's side)
  hosts        SshHosts: instances as agents on machines you have, started over ssh; hosts_job
  run          run_job (the driver) and train / job_report (what a `parcae train` command wires)
  observer     JobObserver: the hooks through which MLflow tracking and progress bars watch a job
  planning     the live planning hook: PlanRequest, RulePlanner, LiveputPlanner, plans handed in from outside
  profile      RuntimeProfile: iteration time per D x P and migration costs as the planner reads them (JSON)
  measure      the profiling job (one run_job visiting every strategy) that measures a RuntimeProfile
  calibration  pure fits of liveput's CostConstants on measured migrations
  tracking     MlflowJobObserver: a training job's MLflow run (metrics, migrations, plans, checkpoints, timeline)
  tracking_sender  MlflowSender: the buffered thread that sends a run to MLflow without blocking the driver
  aws          AwsSpotProvider (EC2 spot through boto3), aws_job (a RemoteJob on it), interruption notices
  aws_config   AwsSpotConfig (what a job's spot instances look like), their tags and boot script (user_data)
  aws_errors   AwsProviderError / AwsCredentialsError with the fix for each AWS error code; aws_call
  imds         on the instance: the IMDSv2 spot interruption watcher the instance agent runs
"""
