"""An in-memory ``MoveLedger`` (``autoscaler.ports``): one shared record with the API server's optimistic
concurrency, for tests of the rebalancer's hourly bound across a change of leader."""

from __future__ import annotations

import threading

from autoscaler.ports import PortError


class SharedMoveRecord:
    """The stored object several ledgers (one per controller process) read and write."""

    def __init__(self, move_times: tuple[float, ...] = ()) -> None:
        self.move_times = move_times
        self.moved_for: tuple[tuple[str, float], ...] = ()  # the targets moved for, and when
        self.version = 0
        self.fail_reads = 0  # the next this many reads raise PortError
        self.fail_writes = 0  # the next this many writes raise PortError
        self.lock = threading.Lock()


class InMemoryMoveLedger:
    def __init__(self, record: SharedMoveRecord | None = None) -> None:
        self.record = record if record is not None else SharedMoveRecord()
        self._seen: int | None = None  # the version this process last read or wrote
        self._targets: tuple[tuple[str, float], ...] = ()  # as the last read found them
        self.writes: list[tuple[float, ...]] = []  # the move times of each write

    def read(self) -> tuple[float, ...]:
        record = self.record
        with record.lock:
            if record.fail_reads:
                record.fail_reads -= 1
                raise PortError("move ledger: read: injected fault")
            self._seen = record.version
            self._targets = record.moved_for
            return record.move_times

    def targets(self) -> tuple[tuple[str, float], ...]:
        return self._targets

    def write(self, move_times: tuple[float, ...], targets: tuple[tuple[str, float], ...] = ()) -> None:
        record = self.record
        with record.lock:
            if record.fail_writes:
                record.fail_writes -= 1
                raise PortError("move ledger: write: injected fault")
            if self._seen != record.version:
                raise PortError("move ledger: write: 409 Conflict (written by another process since this one read it)")
            record.move_times = tuple(move_times)
            record.moved_for = tuple(targets)
            record.version += 1
            self._seen = record.version
            self.writes.append(tuple(move_times))
