"""Exit statuses a cron job, a CI step or an on-call script reads (docs/operators/running.md)."""

EXACT = 0  # every set the run loaded ended equal to the source by its own checks
FAILED = 1  # the run failed (a wrong secret, the service unreachable, a crash)
CONFIG = 2  # a setting or a flag is wrong: nothing ran
NOT_EXACT = 3  # the run finished and published, but a check of severity ERROR failed
