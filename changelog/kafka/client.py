"""Kafka client settings shared by everything in localstate that talks to Kafka.

One place turns a validated option table (from ``[changelogs.kafka]``, ``[inputs.<name>]`` or
``[outputs.<name>]``) into the keyword arguments every kafka-python client accepts
(``KafkaProducer``, ``KafkaConsumer``, ``KafkaAdminClient``)::

    from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings, kafka_error

    class MySystem:
        options = {**CONNECTION_OPTIONS, "topic": Option(str)}

    settings = client_settings(validated)            # bootstrap_servers, security, timeouts
    try:
        producer = KafkaProducer(**settings, acks="all")
    except KafkaError as exc:
        raise kafka_error(exc, "connect", settings["bootstrap_servers"]) from exc

Secrets never have to be in the TOML file: every secret option ``X`` has a twin ``X_env`` naming
an environment variable to read it from (``sasl_plain_password_env = "KAFKA_PASSWORD"``). The
variable is read when the client is built (on the executor), not when the config is validated,
so a driver need not hold the secret.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from localstate.core.options import Option, parse_duration
from localstate.errors import ChangelogError, ConfigError, LocalStateError

__all__ = [
    "CONNECTION_OPTIONS",
    "SECRET_OPTIONS",
    "SECURITY_PROTOCOLS",
    "SASL_MECHANISMS",
    "client_settings",
    "bootstrap_servers",
    "kafka_error",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
#: Options whose value may instead come from the environment variable named by ``<option>_env``.
SECRET_OPTIONS = ("sasl_plain_username", "sasl_plain_password", "ssl_password")


def _servers(value: Any) -> list[str]:
    """Accept ``"h1:9092,h2:9092"`` or ``["h1:9092", "h2:9092"]``; return a non-empty list."""
    items = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(item, str) for item in items):
        raise ValueError(f"expected 'host:port' or a list of them, got {value!r}")
    servers = [item.strip() for item in items if item.strip()]
    if not servers:
        raise ValueError(f"expected 'host:port' or a list of them, got {value!r}")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bootstrap server {server!r} is not 'host:port'")
    return servers


def _secret(name: str) -> dict[str, Option]:
    return {
        name: Option(str, default=None, doc=f"{name.replace('_', ' ')} (prefer {name}_env to keep it out of the file)"),
        f"{name}_env": Option(str, default=None, doc=f"environment variable holding {name}"),
    }


#: The connection options every Kafka-talking plugin accepts (merge them into its ``options``).
CONNECTION_OPTIONS: dict[str, Option] = {
    "bootstrap_servers": Option((str, list), parse=_servers,
                                doc="'host:port[,host:port...]' or a list: the Kafka cluster to connect to"),
    "client_id": Option(str, default="localstate", doc="client id reported to the brokers"),
    "security_protocol": Option(str, default="PLAINTEXT", choices=SECURITY_PROTOCOLS,
                                doc="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    "sasl_mechanism": Option(str, default=None, choices=(None, *SASL_MECHANISMS),
                             doc="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI or OAUTHBEARER"),
    **_secret("sasl_plain_username"),
    **_secret("sasl_plain_password"),
    "ssl_cafile": Option(str, default=None, doc="CA bundle (PEM) to verify the brokers"),
    "ssl_certfile": Option(str, default=None, doc="client certificate (PEM) for mutual TLS"),
    "ssl_keyfile": Option(str, default=None, doc="client private key (PEM) for mutual TLS"),
    **_secret("ssl_password"),
    "ssl_check_hostname": Option(bool, default=True, doc="verify that the broker certificate matches its host"),
    "connect_timeout": Option((int, float, str), default=10.0, parse=parse_duration, minimum=0.1,
                              doc="give up connecting to the cluster after this long ('10s')"),
    "request_timeout": Option((int, float, str), default=30.0, parse=parse_duration, minimum=0.1,
                              doc="timeout of one request to a broker ('30s')"),
    "api_version": Option(str, default=None,
                          doc="broker API version as 'X.Y[.Z]' (skips probing); default: probe the broker"),
}


def bootstrap_servers(options: Mapping[str, Any]) -> str:
    """The bootstrap servers as one comma-separated string, for messages."""
    value = options.get("bootstrap_servers") or []
    return ",".join(value) if isinstance(value, list) else str(value)


def _resolve_secret(options: Mapping[str, Any], name: str, path: str) -> str | None:
    variable = options.get(f"{name}_env")
    if variable:
        value = os.environ.get(variable)
        if value is None:
            raise ConfigError.at(f"{path}{name}_env", f"environment variable {variable!r} is not set",
                                 hint=f"export {variable} in the environment of every process that runs the job "
                                      "(Spark executors too), or set the option directly")
        return value
    return options.get(name)


def client_settings(options: Mapping[str, Any], *, path: str = "") -> dict[str, Any]:
    """kafka-python keyword arguments for any client (producer, consumer, admin) from validated
    ``CONNECTION_OPTIONS`` values. Secrets given as ``X_env`` are read from the environment now.
    ``path`` (e.g. ``"changelogs.kafka"``) prefixes the option names in errors.

    Raises ConfigError when a named environment variable is unset or options contradict each
    other (for example a SASL protocol without a mechanism).
    """
    path = f"{path}." if path else ""
    raw_servers = options.get("bootstrap_servers")
    if not raw_servers:
        raise ConfigError.at(path + "bootstrap_servers", "required option is missing")
    servers = raw_servers if isinstance(raw_servers, list) else _servers(raw_servers)
    protocol = options.get("security_protocol") or "PLAINTEXT"
    mechanism = options.get("sasl_mechanism")
    if protocol.startswith("SASL") and not mechanism:
        raise ConfigError.at(path + "sasl_mechanism", f"security_protocol {protocol} needs a sasl_mechanism",
                             hint="set sasl_mechanism, e.g. 'PLAIN' or 'SCRAM-SHA-512'")
    settings: dict[str, Any] = {
        "bootstrap_servers": servers,
        "client_id": options.get("client_id") or "localstate",
        "security_protocol": protocol,
        "request_timeout_ms": int(1000 * float(options.get("request_timeout") or 30.0)),
        "bootstrap_timeout_ms": int(1000 * float(options.get("connect_timeout") or 10.0)),
        # Do not back off for 30 s between reconnects: a broker that comes back should be used soon.
        "reconnect_backoff_max_ms": 1000,
    }
    if options.get("api_version"):
        try:
            settings["api_version"] = tuple(int(part) for part in str(options["api_version"]).split("."))
        except ValueError as exc:
            raise ConfigError.at(path + "api_version", f"expected 'X.Y' or 'X.Y.Z', got {options['api_version']!r}") from exc
    if protocol.startswith("SASL"):
        settings["sasl_mechanism"] = mechanism
        username = _resolve_secret(options, "sasl_plain_username", path)
        password = _resolve_secret(options, "sasl_plain_password", path)
        if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and (username is None or password is None):
            raise ConfigError.at(path + "sasl_plain_username", f"SASL {mechanism} needs a username and a password",
                                 hint="set sasl_plain_username(_env) and sasl_plain_password(_env)")
        settings["sasl_plain_username"] = username
        settings["sasl_plain_password"] = password
    if protocol in ("SSL", "SASL_SSL"):
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if options.get(name):
                settings[name] = options[name]
        password = _resolve_secret(options, "ssl_password", path)
        if password is not None:
            settings["ssl_password"] = password
        settings["ssl_check_hostname"] = bool(options.get("ssl_check_hostname", True))
    return settings


def kafka_error(exc: BaseException, action: str, servers: str | list[str], *,
                error: type[LocalStateError] = ChangelogError, **context: Any) -> LocalStateError:
    """Turn a kafka-python exception into a typed localstate error that names the cluster.

    ``action`` says what was being done ("connect", "flush", "read", ...); ``context`` adds
    topic/partition/offset. The hint depends on the kind of failure. ``error`` picks the error
    class (ChangelogError by default; InputError/OutputError for streams).
    """
    servers = ",".join(servers) if isinstance(servers, list) else servers
    name = type(exc).__name__
    # kafka-python 3 reports an unreachable cluster as KafkaTimeoutError("Unable to bootstrap from ...");
    # older versions raised NoBrokersAvailable.
    if name in ("NoBrokersAvailable", "KafkaConnectionError", "NodeNotReadyError") or "bootstrap" in str(exc):
        message = f"cannot {action}: Kafka at {servers} is unreachable or not answering ({name}: {exc})"
        hint = ("check that the brokers are running and reachable from this host, that bootstrap_servers is "
                "right, and that security_protocol matches the broker listener")
    elif name in ("KafkaTimeoutError", "RequestTimedOutError", "TimeoutError"):
        message = f"cannot {action}: Kafka at {servers} did not answer in time ({name}: {exc})"
        hint = ("the brokers are slow, overloaded or hung; check their health, or raise the timeout option; "
                "nothing was committed, so the job can simply be restarted")
    elif name in ("TopicAuthorizationFailedError", "ClusterAuthorizationFailedError",
                  "TransactionalIdAuthorizationFailedError", "SaslAuthenticationFailedError",
                  "AuthenticationFailedError"):
        message = f"cannot {action}: Kafka at {servers} refused access ({name}: {exc})"
        hint = "check the SASL/SSL credentials and the ACLs of this principal (topic create/describe/read/write)"
    elif name in ("MessageSizeTooLargeError", "RecordTooLargeError", "RecordListTooLargeError"):
        message = f"cannot {action}: a record is too large for Kafka at {servers} ({name}: {exc})"
        hint = ("raise max_request_size (client) together with the topic's max.message.bytes (broker), "
                "or keep values smaller")
    else:
        message = f"cannot {action}: Kafka at {servers} failed ({name}: {exc})"
        hint = "see the broker logs; the error above comes from the Kafka client"
    return error(message, hint=hint, bootstrap_servers=servers, **context)
