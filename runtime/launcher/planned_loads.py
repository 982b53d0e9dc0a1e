"""Model loads made on purpose, so that the supervisor can tell them from crashes.

A (re)load or an unload replaces a Python model's stub processes: Triton starts the new instances,
then retires the old ones, whose stubs exit. To the supervisor's liveness check (stub PIDs) that
looks exactly like a crash. :class:`PlannedLoads` is the ledger every planned load goes through
(:meth:`EmbeddedServer.load_model`): which models are being loaded now, and a generation per model
that grows with each finished load. A stub that vanished while its model was being loaded, or
whose model's generation grew since the supervisor recorded the stub, left on purpose.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager


class PlannedLoads:
    """Thread-safe ledger of planned model loads (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: Counter[str] = Counter()
        self._generations: Counter[str] = Counter()

    @contextmanager
    def loading(self, models: Iterable[str]) -> Iterator[None]:
        """Mark ``models`` as being (re)loaded or unloaded on purpose for the block; their
        generation grows when it ends, whether the load succeeded or failed (a failed reload
        may still have retired stubs)."""
        names = list(dict.fromkeys(models))
        with self._lock:
            self._active.update(names)
        try:
            yield
        finally:
            with self._lock:
                self._active.subtract(names)
                self._generations.update(names)
                self._active = +self._active  # drop the zero counts

    def busy(self, model: str) -> bool:
        """Whether a planned load of ``model`` is under way."""
        with self._lock:
            return self._active[model] > 0

    def generation(self, model: str) -> int:
        """How many planned loads of ``model`` finished so far."""
        with self._lock:
            return self._generations[model]


class StubExits:
    """The supervisor's reading of :class:`PlannedLoads`: which models' vanished stubs a planned
    load retired. ``calls`` is the call graph (:func:`model_graph.model_calls`), ``ensembles``
    the ensembles among its models: Triton loads an ensemble's steps with it, so their stubs may
    be retired by the ensemble's load too. :meth:`record` remembers the generations seen when the
    supervisor took its stub snapshot of some models."""

    def __init__(
        self, planned: PlannedLoads, calls: Mapping[str, set[str]], ensembles: Iterable[str]
    ) -> None:
        self.planned = planned
        self.calls = calls
        self.ensembles = set(ensembles)
        self._seen: dict[str, int] = {}

    def loaders(self, model: str) -> set[str]:
        """``model`` and every ensemble that calls it, directly or through other steps."""
        found = {model}
        frontier = {model}
        while frontier:
            frontier = {e for e in self.ensembles if self.calls.get(e, set()) & frontier} - found
            found |= frontier
        return found

    def record(self, models: Iterable[str]) -> None:
        """The stubs of ``models`` were just snapshotted: loads finished so far are accounted for."""
        for model in models:
            for loader in self.loaders(model):
                self._seen[loader] = self.planned.generation(loader)

    def _changed(self, loader: str) -> bool:
        return self.planned.generation(loader) != self._seen.get(loader, 0)

    def planned_exit(self, model: str) -> bool:
        """Whether a stub of ``model`` that vanished may have been retired on purpose: a load of
        it (or of an ensemble calling it) is under way or finished since :meth:`record`."""
        return any(self.planned.busy(m) or self._changed(m) for m in self.loaders(model))

    def settled(self, models: Iterable[str]) -> set[str]:
        """Those of ``models`` whose planned loads all finished since :meth:`record`: their new
        stubs are up and are to be snapshotted (then :meth:`record`)."""
        out = set()
        for model in models:
            loaders = self.loaders(model)
            if any(self._changed(m) for m in loaders) and not any(
                self.planned.busy(m) for m in loaders
            ):
                out.add(model)
        return out
