"""parcae: liveput-optimised DNN training on preemptible (spot) instances.

The package holds the user-facing entry point, the ``parcae`` command line (:mod:`parcae.cli`):

- ``parcae simulate`` replays a spot-availability trace (:mod:`forecasting.traces`) and compares the
  policies of :mod:`liveput.policies` (Parcae's liveput planner against reactive restarts, Bamboo, the
  ideal bound and on-demand) in samples, dollars and migrations;
- ``parcae plan`` runs the liveput planner (:mod:`liveput.optimizer`) once on a JSON forecast and prints
  the D x P plan as JSON;
- ``parcae traces`` lists the trace names ``--trace`` accepts.

The planning and simulation logic lives in :mod:`liveput`, the trace data in :mod:`forecasting`.
"""
