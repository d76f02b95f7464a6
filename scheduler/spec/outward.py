"""The cluster config's outward channels: the Prometheus endpoint of `serve` (`metrics`), where new alerts are sent
(`notify`), and a Prometheus Alertmanager kept in sync with the alerts (`alertmanager`). Part of the cluster config
(config.py re-exports them); what they do is scheduler/serve/metrics.py, notify.py and alertmanager.py.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ftconsole.scheduler.spec.values import PositiveDuration


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_HOST_NAME = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?:\.(?!-)[A-Za-z0-9-]{1,63})*\.?$")


def parse_listen(value: Any) -> tuple[str, int]:
    """'127.0.0.1:9464', '[::1]:9464' or 'localhost:9464' -> (host, port); ValueError saying what is wrong."""
    hint = "give HOST:PORT, such as 127.0.0.1:9464, [::1]:9464 or 0.0.0.0:9464 (every interface)"
    if not isinstance(value, str):
        raise ValueError(f"{hint}, not {value!r}")
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{hint}, not {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in {value!r} is not an IPv6 address; {hint}") from None
    elif ":" in host:
        raise ValueError(f"{value!r}: put an IPv6 address in brackets, as in [::1]:9464")
    elif not _HOST_NAME.match(host) or (host.replace(".", "").isdigit() and not _ipv4(host)):
        raise ValueError(f"{host!r} in {value!r} is not a host name or IP address; {hint}")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} in {value!r} is not a number from 1 to 65535")
    return host, int(port)


def _ipv4(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


class MetricsSettings(_Strict):
    """The Prometheus endpoint of `ftconsole serve`: http://<listen>/metrics (docs/operations.md, Metrics)."""

    listen: str  # HOST:PORT to serve on; the metrics section absent: no endpoint

    @field_validator("listen", mode="before")
    @classmethod
    def _listen(cls, value: Any) -> str:
        parse_listen(value)
        return str(value).strip()

    @property
    def address(self) -> tuple[str, int]:
        return parse_listen(self.listen)


def _webhook_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme.lower() not in ("http", "https"):
        got = f"a {parts.scheme!r} URL" if parts.scheme else "no URL scheme"
        raise ValueError(f"the webhook must be an http:// or https:// URL, got {got}")
    if not parts.hostname:
        raise ValueError("the webhook URL names no host (as in https://hooks.example.com/...)")
    return url.strip()


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # a Prometheus label name


class AlertmanagerSettings(_Strict):
    """A Prometheus Alertmanager kept in sync with the alerts (docs/operations.md, Notifications)."""

    url: Annotated[str, AfterValidator(_webhook_url)]  # its base URL, e.g. http://alertmanager:9093
    interval: PositiveDuration = 60.0  # every alert still open is sent again this often (within 2 s of a change)
    labels: dict[str, str] = {}  # added to every alert's labels (cluster: prod, say)

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for name in labels:
            if not _LABEL_NAME.match(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a label name (letters, digits, '_'; not a digit or __ first)")
        return labels


class NotifySettings(_Strict):
    """Where new alerts are sent (docs/operations.md, Notifications); neither webhook nor command: nowhere."""

    webhook: Annotated[str, AfterValidator(_webhook_url)] | None = None  # a JSON POST of each alert
    headers: dict[str, str] = {}  # sent with the webhook's POST (an Authorization header, say)
    command: list[str] | None = Field(None, min_length=1)  # argv run with the alert JSON on stdin; no shell
    retries: int = Field(3, ge=0, le=10)  # tries after a failed one, 1s, 2s, 4s ... apart
    rate_limit: int = Field(30, ge=1, le=10_000)  # notifications a minute; those over it go out as one
    timeout: PositiveDuration = 10.0  # per try
    jobs: Literal["opted-in", "all"] = "opted-in"  # job alerts of jobs with `notify: true` only, or of all

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not an HTTP header name (letters, digits, '-'; no space or ':')")
            if any(c in value for c in "\r\n\0"):
                raise ValueError(f"the value of header {name!r} has a line break or NUL")
        return headers

    @field_validator("command")
    @classmethod
    def _argv(cls, argv: list[str] | None) -> list[str] | None:
        if argv is not None and (not argv[0].strip() or any("\0" in arg for arg in argv)):
            raise ValueError("give the command as a list: [program, arg, ...], the program not empty, no NUL")
        return argv

    @model_validator(mode="after")
    def _headers_need_webhook(self) -> NotifySettings:
        if self.headers and self.webhook is None:
            raise ValueError("headers are sent with the webhook's POST, and no webhook is set")
        return self
