"""``python -m celery_fair_green gevent|eventlet CELERY-ARGS...``: a green fair worker.

Celery monkey-patches the process for gevent and eventlet only when ``-P gevent`` or
``-P eventlet`` is on its command line, before anything else is imported. Under ``-P fair``
the green pool is chosen by the ``fair_pool`` setting, which Celery reads far too late to
patch, so this launcher patches first (with Celery's own routine, the same one ``-P gevent``
runs) and then hands the rest of the command line to ``celery``::

    python -m celery_fair_green gevent -A app worker -P fair -c 100

It is a package of its own, outside ``celery_fair``, because importing ``celery_fair`` may import
Celery and Kombu (it registers the pool when Celery is loaded), and modules imported before the
patch keep the blocking functions they captured (Kombu's poller keeps the real ``select``,
which stalls every greenlet).

A worker whose ``fair_pool`` is green but whose process was not patched refuses to start and
names this command: unpatched, one blocking task would stall every other task and the gate.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

GREEN_POOLS = ("gevent", "eventlet")

USAGE = "usage: python -m celery_fair_green {gevent|eventlet} CELERY-ARGS..."


def main(argv: Sequence[str] | None = None) -> int:
    """Patch the process for the green pool named first, then run ``celery`` with the rest."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in GREEN_POOLS:
        print(USAGE, file=sys.stderr)
        return 2
    pool, rest = args[0], args[1:]
    try:
        importlib.import_module(pool)  # what Celery's patching imports first, too
    except ModuleNotFoundError:
        print(
            f"celery_fair_green: the {pool} pool needs {pool}, which is not installed: "
            f"pip install 'celery-fair[green]' (or pip install {pool})",
            file=sys.stderr,
        )
        return 2
    import celery

    celery.maybe_patch_concurrency(["-P", pool])  # Celery's own patching, as for -P gevent
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", *rest]
    return int(celery_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
