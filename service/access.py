"""Who may use `serve`: a bind address beyond loopback needs a bearer token; requests carry it, compared in constant
time; the replicas' gRPC servers stay on loopback in a local cluster (SECURITY.md, "serve")."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any

TOKEN_ENV = "TOKENFUSE_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16
UNAUTHORIZED = "missing or wrong token: send the header `Authorization: Bearer <token>`"


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the service on this machine (localhost, 127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def token_digest(token: str) -> str:
    """What ServiceConfig keeps of a token: its sha256 (hex)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def access_error(host: str, token: str | None) -> str | None:
    """Why `serve` must not start with this bind address and token (None: it may)."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        return (
            f"serve: the token must be at least {MIN_TOKEN_CHARS} characters (make one with "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    if token is None and not is_loopback(host):
        return (
            f"serve: --host {host} exposes the service beyond this machine: give a token (--token, or the {TOKEN_ENV} "
            "environment variable, which other users cannot read from the process list); clients then send "
            "`Authorization: Bearer <token>`"
        )
    return None


def authorized(header: str | None, digest: str | None) -> bool:
    """Whether an Authorization header carries the token whose sha256 is `digest` (None: no token needed). The
    digests are compared in constant time (hmac.compare_digest), so the answer's timing says nothing of the token."""
    if digest is None:
        return True
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    return hmac.compare_digest(token_digest(given.strip()), digest)


_LOOPBACK_GRPC: dict[str, Any] = {}  # the wrapper replica_grpc_on_loopback installed (installed once per process)


def replica_grpc_on_loopback() -> None:
    """Ray Serve (2.60 checked) binds each replica's inter-deployment gRPC server on [::]:0, every interface, even in a
    cluster whose node address is 127.0.0.1 (runner/ray/cluster.connect's local cluster): on such a node, bind it on
    127.0.0.1 instead (its peers reach it at the node address). Called in the replica before Serve starts that
    server; elsewhere, or with a Serve that has no such hook, nothing changes."""
    try:
        import ray
        from ray.serve._private import replica as serve_replica
    except ImportError:
        return
    add = getattr(serve_replica, "add_port_to_grpc_server", None)
    if add is None or add in _LOOPBACK_GRPC.values() or not is_loopback(ray.util.get_node_ip_address()):
        return

    def on_loopback(server: Any, address: str) -> Any:
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address[len("[::]:") :]
        return add(server, address)

    _LOOPBACK_GRPC["wrapper"] = on_loopback
    serve_replica.add_port_to_grpc_server = on_loopback
