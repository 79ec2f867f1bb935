"""Start `serve`: FusionReplica (service/app.py) as a Ray Serve deployment with batching and backpressure, on a local
or joined Ray cluster, until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import asdict, dataclass
from typing import Any

from tokenfuse.service.access import access_error, is_loopback
from tokenfuse.service.app import FusionReplica, ServiceConfig

log = logging.getLogger("tokenfuse.service")


def build_app(config: ServiceConfig, replicas: int, max_queued: int, retry_after_s: float, num_gpus: float) -> Any:
    from ray import serve
    from ray.serve.config import BackpressureConfig

    deployment = serve.deployment(
        name="TokenFuse",
        num_replicas=replicas,
        max_ongoing_requests=max(2 * config.max_batch, 2),
        max_queued_requests=max_queued,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=retry_after_s),
        graceful_shutdown_timeout_s=120,
        ray_actor_options={"num_gpus": num_gpus, "num_cpus": 1},
    )(FusionReplica)
    return deployment.bind(asdict(config))


@dataclass(frozen=True)
class ServeOptions:
    """Where and how the service runs (`serve`'s command line): the Ray address ("local": a cluster of its own), the
    HTTP host and port, the replicas, how many requests may wait (more get 503) and that 503's Retry-After."""

    address: str = "local"
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    max_queued: int = 8
    retry_after_s: float = 2.0


def serve_forever(
    config: ServiceConfig,
    opts: ServeOptions = ServeOptions(),
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Start the service and block until SIGINT/SIGTERM (or `stop`), then shut down gracefully; `ready` is set once
    it serves. Refuses (ValueError) a host beyond loopback when config has no token (access_error)."""
    address, host, port, replicas = opts.address, opts.host, opts.port, opts.replicas
    max_queued, retry_after_s = opts.max_queued, opts.retry_after_s
    if config.token_sha256 is None and not is_loopback(host):
        raise ValueError(access_error(host, None))
    from tokenfuse.runner.ray.cluster import connect

    ray = connect(address, num_cpus=max(replicas, 1) + 1 if address == "local" else None)
    from ray import serve

    gpus = ray.cluster_resources().get("GPU", 0)
    stop = stop or threading.Event()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, lambda *a: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(
            build_app(config, replicas, max_queued, retry_after_s, 1.0 if gpus >= 1 else 0.0),
            name="tokenfuse",
            route_prefix="/",
            blocking=False,
        )
        log.info(
            "TokenFuse service on http://%s:%d (replicas %d, max batch %d)", host, port, replicas, config.max_batch
        )
        log.info("TokenFuse service ready on http://%s:%d (POST an image; GET /health; Ctrl-C stops)", host, port)
        if config.token_sha256 is not None:
            log.info(
                "TokenFuse service: every request needs `Authorization: Bearer <token>` (GET /health: status only)"
            )
        if ready is not None:
            ready.set()
        while not stop.wait(0.5):
            pass
    finally:
        log.info("TokenFuse service: shutting down (draining in-flight requests)")
        serve.shutdown()
        if address == "local":
            ray.shutdown()
        for sig, h in handlers.items():
            signal.signal(sig, h)
