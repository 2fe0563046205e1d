"""EC2 names shared by the fleet collector (`forecasting.collect`) and the trainer's spot provider
(`trainer.providers.aws`): the tag that marks a job's instances, the states that count as alive, the API's cap on
filter values.

Owns: these constants, one definition each. Pure: no boto3, no pandas (the face exports them cheaply). Must not
touch: anything that calls AWS.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ALIVE_STATES", "FILTER_VALUES_MAX", "JOB_TAG_KEY"]

#: The EC2 tag that marks the job's own instances (``tag:parcae:job`` in filters).
JOB_TAG_KEY: Final = "parcae:job"
#: Instance states in which an instance counts as alive (it is, or is about to be, running).
ALIVE_STATES: Final = ("pending", "running")
#: EC2 caps the values of one filter.
FILTER_VALUES_MAX: Final = 200
