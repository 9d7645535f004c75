from fixtures import _services, broker, make_run, start_worker  # noqa: F401
