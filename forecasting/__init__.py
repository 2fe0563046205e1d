"""forecasting."""

from forecasting.ec2 import ALIVE_STATES, FILTER_VALUES_MAX, JOB_TAG_KEY

__all__ = ["ALIVE_STATES", "FILTER_VALUES_MAX", "JOB_TAG_KEY"]
