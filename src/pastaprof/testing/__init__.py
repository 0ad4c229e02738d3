"""Helpers for testing analyses: synthetic multi-rank jobs with planted causes (:mod:`.jobs`)."""

from pastaprof.testing.jobs import ClockSkew, Imbalance, Job, SlowLink, SlowRank, Straggler, make_job

__all__ = ["ClockSkew", "Imbalance", "Job", "SlowLink", "SlowRank", "Straggler", "make_job"]
