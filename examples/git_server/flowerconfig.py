# Flower's configuration file: `celery -A examples.git_server.app flower --conf=<this file>`.
# One line shows each job's fairness key, type, job id and wait in Flower, and the fleet's
# fairness on Flower's /metrics (docs/metrics.md#flower).
from celery_fair.flower import *  # noqa: F403
