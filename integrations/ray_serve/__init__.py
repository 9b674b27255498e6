"""`asymagent serve --ray`: the OpenAI-compatible server as N engine replicas on Ray Serve.

Files (one concept each): `affinity.py` (a request's conversation key), `router.py` (Ray Serve
request router keeping a conversation on its replica), `asgi_call.py` (one HTTP request run
through an in-process ASGI app), `replica.py` (an engine replica: `create_app` over its own
Engine), `ingress.py` (the HTTP front: parses the body, routes, retries, 503s), `board.py` and
`metrics_merge.py` (per-replica and total Prometheus metrics), `launch.py` (Ray start, deploy,
the `--ray` flags' checks). Ray is optional: only `launch.check_ray` and `launch.main` are
reached without it, and nothing outside this package imports Ray Serve.
"""
