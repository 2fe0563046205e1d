"""The control plane: the coordinator's decisions, the driver that applies a schedule, and the live planner.

Map: `coordinator` (membership, heartbeats, boundary decisions, recoveries, records), `events` (the schedule format,
`Schedule`), `dry_run` (a schedule checked before any process starts: `check_schedule`, `ScheduleError`),
`schedules` (traces and chaos turned into schedules), `planning` (`PlanRequest`, the planners,
`hand_plan`), `run` (`run_job(config, schedule)`, `train(config)`), `driver` (the loop that applies a schedule),
`fleet_driver` (the same, on what a live fleet gives), `measure` (the profiling job), `job_file` (a job's settings
from one file: `load_job`).
Must not touch: training maths (`trainer.runtime`), how a provider starts processes (`trainer.providers`).
"""
