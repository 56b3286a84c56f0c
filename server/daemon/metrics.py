"""The daemon's Prometheus endpoint (``pixpool serve --metrics-port P``).

Runs in the daemon process: ``scrape_server.ScrapeServer`` answers scrapes in a thread of
its own, with a cap on connections and a deadline on each (prometheus-client's own server
kept a thread and a descriptor per idle connection, without a timeout); the text
is prometheus-client's. The loop never shares live state with that thread: every liveness
tick it ``publish``es its ``status`` reply (``shared.wire.status.Status``, frozen) and its
error counts (a plain dict), each replaced whole, never mutated; a scrape reads the last
ones plus what it measures itself at that moment (segment sizes in the store, each
process's PSS from ``/proc/PID/smaps_rollup``). Names and labels are documented in
``docs/memory.md``; a Grafana dashboard for them is ``deploy/grafana-dashboard.json``.
"""

from __future__ import annotations

import logging
import os
import threading

from ...shared.transport.names import DEFAULT_STORE
from ...shared.transport.procmem import process_memory
from ...shared.transport.store import Store
from ...shared.wire.status import Status

log = logging.getLogger(__name__)


class Metrics:
    """Publish the daemon's figures on ``http://host:port/metrics`` (see module docstring)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._status: Status | None = None
        self._counts: dict = {}
        self._lock = threading.Lock()
        self._server = None
        self._registry = None

    def start(self) -> "Metrics":
        from prometheus_client import CollectorRegistry

        from .scrape_server import ScrapeServer

        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(self))
        self._server = ScrapeServer(self.host, self.port, self._render).start()
        log.info(
            "metrics on http://%s:%d/metrics (at most %d connections at once, %.0f s each)",
            self.host, self.port, self._server.max_connections, self._server.timeout_s,
        )  # fmt: skip
        return self

    def publish(self, status: Status, *, housekeeping_errors: dict | None = None, handshakes_refused: int = 0) -> None:
        """The loop's latest ``status`` reply; ``housekeeping_errors``: step -> OSErrors since
        start (``housekeeping.py``); ``handshakes_refused``: TCP connections the handshake
        guard shut down (``handshake_guard.py``)."""
        counts = {"housekeeping_errors": dict(housekeeping_errors or {}), "handshakes_refused": handshakes_refused}
        with self._lock:
            self._status, self._counts = status, counts

    def latest(self) -> Status | None:
        with self._lock:
            return self._status

    def counts(self) -> dict:
        with self._lock:
            return self._counts

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _render(self, accept: str) -> tuple[str, bytes]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return content_type, encoder(self._registry)


class _Collector:
    def __init__(self, metrics: Metrics):
        self._metrics = metrics

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self._metrics.latest()
        if st is None:
            return
        snap = st.snapshot
        store = Store.of(st.daemon.store)
        # The dtype label lets a dashboard name the pixel type it plots (uint8 by default,
        # float32 when asked for), not assume one.
        seg = GaugeMetricFamily(
            "pixpool_snapshot_bytes",
            "Bytes of each segment of the served snapshot, measured in the store",
            labels=["segment", "dtype"],
        )
        dtype_of = {n: info.dtype or "?" for info in st.served.values() for n in info.segments or ()}
        for name in sorted(dtype_of):
            try:
                seg.add_metric([name, dtype_of[name]], os.stat(store.path(name)).st_size)
            except FileNotFoundError:
                continue
        yield seg
        yield GaugeMetricFamily(
            "pixpool_decoded_equivalent_bytes",
            "What the same resized images take as a decoded uint8 cache",
            value=snap.decoded_bytes or 0,
        )
        roles = {st.daemon.pid: "daemon"}
        roles.update({w.pid: "worker" for w in st.workers if w.pid})
        roles.update({t.pid: "trainer" for t in st.trainers if t.pid and t.pid_watched})
        pss = GaugeMetricFamily(
            "pixpool_process_pss_bytes",
            "PSS of each local process of the service and its trainers (smaps_rollup)",
            labels=["role", "pid"],
        )
        for p in process_memory(list(roles), store):
            pss.add_metric([roles[p.pid], str(p.pid)], p.pss)
        yield pss
        ring = GaugeMetricFamily("pixpool_ring_bytes", "Bytes of each trainer's batch ring", labels=["trainer"])
        batches = CounterMetricFamily(
            "pixpool_trainer_batches", "Batches delivered to each trainer", labels=["trainer"]
        )
        images = CounterMetricFamily("pixpool_trainer_images", "Images delivered to each trainer", labels=["trainer"])
        wait = CounterMetricFamily(
            "pixpool_trainer_data_wait_seconds",
            "Seconds each trainer waited for batches since it attached (its own count)",
            labels=["trainer"],
        )
        for t in st.trainers:
            tid = str(t.trainer_id)
            ring.add_metric([tid], t.ring_nbytes)
            batches.add_metric([tid], t.batches_delivered)
            images.add_metric([tid], t.images_delivered)
            wait.add_metric([tid], t.data_wait_s)
        yield from (ring, batches, images, wait)
        busy = CounterMetricFamily(
            "pixpool_worker_busy_seconds", "Seconds each augmentation worker spent rendering", labels=["worker"]
        )
        done = CounterMetricFamily(
            "pixpool_worker_samples", "Samples each augmentation worker rendered", labels=["worker"]
        )
        for w in st.workers:
            busy.add_metric([str(w.index)], w.busy_s)
            done.add_metric([str(w.index)], w.samples_done)
        yield from (busy, done)
        vfs = os.statvfs(store)
        free, size = vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize
        yield GaugeMetricFamily(
            "pixpool_store_free_bytes", f"Free bytes in the store ({DEFAULT_STORE} by default)", value=free
        )
        yield GaugeMetricFamily(
            "pixpool_store_size_bytes", f"Size of the store's file system ({DEFAULT_STORE} by default)", value=size
        )
        # A trainer's validation pass is a session of its own, but no trainer (``TrainerStatus.is_validation``).
        validating = sum(1 for t in st.trainers if t.is_validation)
        yield GaugeMetricFamily("pixpool_trainers", "Trainers attached", value=len(st.trainers) - validating)
        yield GaugeMetricFamily(
            "pixpool_validation_streams", "Validation passes under way (sessions on the val split)", value=validating
        )
        yield CounterMetricFamily(
            "pixpool_worker_restarts",
            "Augmentation workers replaced after dying",
            value=st.daemon.worker_restarts,
        )
        counts = self._metrics.counts()
        errors = CounterMetricFamily(
            "pixpool_housekeeping_errors",
            "OSErrors in the daemon's periodic steps (skipped that tick and retried; EMFILE: descriptors exhausted)",
            labels=["step"],
        )
        for step, n in sorted(counts.get("housekeeping_errors", {}).items()):
            errors.add_metric([step], n)
        yield errors
        yield CounterMetricFamily(
            "pixpool_tcp_handshakes_refused",
            "TCP connections shut down before their handshake, over the caps per address and in all",
            value=counts.get("handshakes_refused", 0),
        )
