"""A fair worker on a green pool: ``python -m celery_fair_green gevent -A app worker -P fair``.

See ``__main__``. Nothing is imported here, on purpose: the process must be patched first.
"""
