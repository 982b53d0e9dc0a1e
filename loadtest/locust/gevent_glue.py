"""What every locustfile needs so that gevent, gRPC and Locust's ``--run-time`` behave; importing
this module registers it (before any gRPC channel exists):

- gRPC's C core cooperates with gevent (``init_gevent``), or a blocking call stalls every user
  and the run's own timer;
- the run time is counted from now: gevent's loop caches its clock, last read when ``locust`` was
  imported, and ``--run-time``'s timer is armed from that cached time, so the seconds spent
  importing the locustfile were taken off the run (on a loaded host a 4 s run of the rerank users
  lasted 0.23 s and ended before any request);
- the process exits with Locust's code once Locust has written everything, skipping the
  interpreter's teardown: there a tritonclient gRPC client left to garbage collection (a user
  stopped inside ``on_start``) closes its channel, and under gevent that close deadlocks on a
  gRPC mutex in a finalizer (a 4 s run hung past 300 s).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

import gevent
import grpc.experimental.gevent as grpc_gevent
from locust import events

grpc_gevent.init_gevent()


@events.init.add_listener
def _fresh_loop_time(**kwargs: Any) -> None:
    """Locust fires ``init`` just before it arms the ``--run-time`` timer."""
    gevent.get_hub().loop.update_now()


@events.quit.add_listener
def _skip_teardown(exit_code: int, **kwargs: Any) -> None:
    def exit_now() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)

    atexit.register(exit_now)
