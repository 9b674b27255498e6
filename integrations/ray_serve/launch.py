"""`asymagent serve --ray [ADDRESS] --replicas N`: start (or join) Ray, deploy, serve until stopped.

Two Ray Serve deployments in one application, `asymagent`: `EngineReplica` x N (replica.py; each
`--replica-cpus` CPUs as torch threads, `--replica-gpus` GPUs, its requests routed by
`ConversationRouter`, router.py) and one `Ingress` (ingress.py, no CPU reserved) behind Ray's
HTTP proxy on `--host`/`--port`. Without ADDRESS a new local Ray is started with its head node
on 127.0.0.1 and no dashboard; `auto`, HOST:PORT or ray://HOST:10001 join a running cluster
(every node needs the same install and model files: weights are read by each replica from its
own disk). Ray is optional: `check_ray` refuses `--ray` in one line (exit 2) when Ray Serve or
its request-router API (Ray >= 2.46) is missing, before any model loads.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable

INSTALL_HINT = ("--ray needs Ray Serve >= 2.46, which is not installed: "
                "pip install 'asymagent[ray]'")
APP_NAME = "asymagent"
ENGINE_DEPLOYMENT = "engine"
SLACK_ONGOING = 8  # a replica's Ray-level cap is its queue + this: its own 429 comes first


def ray_logging(log_level: str = "warning") -> dict:
    """Ray Serve's LoggingConfig for our deployments: its per-request access lines only at
    --log-level debug/trace (they would print a line per request on the driver)."""
    verbose = log_level in ("debug", "trace")
    return {"log_level": "DEBUG" if verbose else log_level.upper(), "enable_access_log": verbose}


def check_ray(args) -> None:
    """Refuse `--ray` flags that cannot work (ValueError: one line, exit 2), before any model."""
    if args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if not args.replica_cpus > 0 or args.replica_gpus < 0:
        raise ValueError("--replica-cpus must be > 0 and --replica-gpus >= 0")
    if args.replica_gpus > 0 and args.device == "cpu":
        raise ValueError("--replica-gpus needs --device cuda (or auto): the replicas would "
                         "hold GPUs and decode on the CPU")
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
        from ray.serve.request_router import RequestRouter  # noqa: F401
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    if not args.ray:  # a new local Ray: this machine must hold every replica
        cpus = os.cpu_count() or 1
        if args.replicas * args.replica_cpus > cpus:
            raise ValueError(f"--replicas {args.replicas} x --replica-cpus {args.replica_cpus:g} "
                             f"needs {args.replicas * args.replica_cpus:g} CPUs; this machine has "
                             f"{cpus} (lower --replica-cpus, e.g. {cpus / args.replicas:g})")


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def first_name(names) -> str:
    """The name answers carry: `--served-model-name` may give several (the first wins)."""
    return names if isinstance(names, str) else names[0]


def app_kwargs_from(args) -> dict:
    """create_app's keyword arguments from the `serve` flags (the same as the single server)."""
    api_key = args.api_key or os.environ.get("ASYMAGENT_API_KEY")
    return dict(model_name=args.model_name, api_key=api_key, max_queue=args.max_queue,
                request_timeout=args.request_timeout, max_body_bytes=args.max_body_bytes,
                default_mode=args.mode, default_max_tokens=args.max_tokens,
                default_temperature=args.temperature, cors_origins=args.allowed_origins,
                max_model_len=args.max_model_len)


def trace_from(args, api_key: str | None) -> dict | None:
    if not getattr(args, "trace_dir", None):
        return None
    return {"dir": os.path.abspath(args.trace_dir), "max_bytes": int(args.trace_max_mb * 2**20),
            "max_files": args.trace_max_files, "secrets": [api_key] if api_key else []}


@dataclass
class RayServer:
    """A running `serve --ray` application; `stop()` removes it (and the Ray it started)."""

    url: str
    started_ray: bool

    def stop(self, timeout_s: float = 60.0) -> None:
        """Remove the application; Serve's shutdown is bounded (a stuck replica never hangs the
        command), then the Ray this server started is shut down."""
        import ray
        from ray import serve

        try:
            closing = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
            closing.start()
            closing.join(timeout_s)
            if closing.is_alive():
                logging.getLogger(__name__).warning(
                    "Ray Serve did not shut down within %.0f s; stopping Ray", timeout_s)
        finally:
            if self.started_ray:
                ray.shutdown()


def build_application(engine_factory: Callable[[], Any], app_kwargs: dict, *, replicas: int,
                      replica_cpus: float, replica_gpus: float, trace: dict | None = None,
                      threads: int | None = None, log_level: str = "warning"):
    """The bound Ray Serve application (engine deployment + ingress), not yet running."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from asymagent.integrations.ray_serve.ingress import Ingress
    from asymagent.integrations.ray_serve.replica import EngineReplica
    from asymagent.integrations.ray_serve.router import ConversationRouter

    from asymagent.modeling.cpu_threads import omp_env

    ongoing = app_kwargs.get("max_queue", 16) + SLACK_ONGOING
    threads = threads or max(1, int(replica_cpus))
    engine = serve.deployment(
        EngineReplica, name=ENGINE_DEPLOYMENT, num_replicas=replicas,
        # each replica's process starts with the engine's OpenMP wait policy and its share of the
        # CPUs as threads (libgomp reads them when the replica imports torch; cpu_threads.py)
        ray_actor_options={"num_cpus": replica_cpus, "num_gpus": replica_gpus,
                           "runtime_env": {"env_vars": omp_env(threads=threads)}},
        max_ongoing_requests=ongoing, max_queued_requests=replicas * ongoing,
        request_router_config=RequestRouterConfig(
            request_router_class=f"{ConversationRouter.__module__}.{ConversationRouter.__name__}"),
        health_check_period_s=2.0, graceful_shutdown_timeout_s=5.0,
        logging_config=ray_logging(log_level),
    ).bind(engine_factory, app_kwargs, trace, threads)
    ingress = serve.deployment(
        Ingress, name="ingress", num_replicas=1, ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=max(100, 4 * replicas * ongoing), logging_config=ray_logging(log_level),
    ).bind(engine, model_name=first_name(app_kwargs.get("model_name", "asymagent")),
           max_body_bytes=app_kwargs.get("max_body_bytes", 8 * 2**20),
           request_timeout=app_kwargs.get("request_timeout", 600.0))
    return ingress


def start(engine_factory: Callable[[], Any], app_kwargs: dict, *, address: str | None = None,
          host: str = "127.0.0.1", port: int = 8000, replicas: int = 2, replica_cpus: float = 1.0,
          replica_gpus: float = 0.0, trace: dict | None = None, threads: int | None = None,
          num_cpus: int | None = None, log_level: str = "warning") -> RayServer:
    """Start Ray if needed (None: a new local one on 127.0.0.1), deploy, wait until ready."""
    import ray
    from ray import serve

    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            ray.init(address="local", include_dashboard=False, _node_ip_address="127.0.0.1",
                     num_cpus=num_cpus, logging_level=logging.WARNING)
    try:
        port = port or free_port(host)
        serve.start(http_options={"host": host, "port": port},
                    proxy_location="HeadOnly" if not address else "EveryNode",
                    logging_config=ray_logging(log_level))
        app = build_application(engine_factory, app_kwargs, replicas=replicas,
                                replica_cpus=replica_cpus, replica_gpus=replica_gpus,
                                trace=trace, threads=threads, log_level=log_level)
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    shown = f"[{host}]" if ":" in host else host
    return RayServer(url=f"http://{shown}:{port}", started_ray=started)


def main(args) -> int:
    """`asymagent serve --ray`: serve until SIGINT/SIGTERM."""
    from asymagent.integrations.serve_setup import load_engine

    app_kwargs = app_kwargs_from(args)
    # SIGINT/SIGTERM only ask to stop, from the first moment: a signal that comes while Ray starts
    # or the application deploys (the HTTP route can answer before serve.run returns) stops the
    # server once it is up, through the same bounded shutdown
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server = start(functools.partial(load_engine, args), app_kwargs,
                   address=args.ray or None, host=args.host, port=args.port,
                   replicas=args.replicas, replica_cpus=args.replica_cpus,
                   replica_gpus=args.replica_gpus, trace=trace_from(args, app_kwargs["api_key"]),
                   threads=args.threads, log_level=getattr(args, "log_level", None) or "info")
    print(f"asymagent serve --ray: {args.replicas} engine replica(s) at {server.url}", flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
    return 0
