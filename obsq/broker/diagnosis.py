"""What the broker says when Redis cannot be reached or refuses a call: the reason of a
failed connection in one line, the likely cause (TLS, the user's ACL), and URLs without
their passwords."""

from __future__ import annotations

import os
import re

from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import TimeoutError as RedisTimeout

from obsq.errors import denied_by_acl
from obsq.settings import REDIS_TLS_VARIABLES

# redis-py's "Error 111 connecting to host:port. Connect call failed (...)."
CONNECT_FAILURE = re.compile(r"Error (-?\d+) connecting to \S+\. (.*?)\.?$", re.DOTALL)
# each Sentinel that did not answer, in a MasterNotFoundError: "<...host=H,port=P...)>)>)> -
# network:ConnectionError"
SENTINEL_FAILURE = re.compile(r"host=([^,]+),port=(\d+).*?\)>\)>\)> - (?:\w+:)?(\w+)",
                              re.DOTALL)


def acl_advice(namespace: str) -> str:
    return f"`obsq acl --namespace {namespace}` prints the ACL rule obsq needs"


def reason(exc: BaseException) -> str:
    """What a failed connection says, in one line: "Connection refused" for redis-py's
    "Error 111 connecting to host:port. Connect call failed (...)", and a Sentinel's
    failure without the repr of each Sentinel's client."""
    text = str(exc)
    failed = CONNECT_FAILURE.match(text)
    if failed:  # asyncio's "Connect call failed (address)" says why by its errno alone
        errno, said = int(failed.group(1)), failed.group(2)
        return os.strerror(errno) if said.startswith("Connect call failed") else said
    sentinels = SENTINEL_FAILURE.findall(text)
    if isinstance(exc, MasterNotFoundError) and sentinels:
        answers = ", ".join(f"{host}:{port} ({error})" for host, port, error in sentinels)
        return f"{text.partition(' : ')[0]}: no answer from the Sentinels at {answers}"
    return text.rstrip(".")


def hint(url: str, exc: BaseException, namespace: str) -> str:
    """What a failed connection (TLS, or a user's permissions) most likely lacks."""
    if denied_by_acl(exc):
        return f"; {acl_advice(namespace)}"
    if not url.startswith("rediss"):
        return ""
    if "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return ("; the server's certificate is not signed by the CA given (ssl_ca_certs in "
                "the URL, or OBSQ_REDIS_TLS_CA)")
    if isinstance(exc, RedisTimeout) or "WRONG_VERSION_NUMBER" in str(exc):
        return ("; the server does not answer the TLS handshake: is it a plain Redis "
                "(redis://), or is this not its TLS port (tls-port)?")
    if "ssl_certfile" not in url and not os.environ.get(REDIS_TLS_VARIABLES["ssl_certfile"]):
        return ("; if Redis asks clients for a certificate (tls-auth-clients), give "
                "ssl_certfile and ssl_keyfile in the URL, or OBSQ_REDIS_TLS_CERT and _KEY")
    return ""


def safe(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return scheme + sep + rest
