"""A PostgreSQL URL without its passwords, for messages, logs and `config check` (pure: the config's check of
`state.url` uses it, and the store's messages)."""

from __future__ import annotations

from urllib.parse import unquote_plus, urlsplit

# the parameters of a URL that hold a secret, as libpq and asyncpg read them (sslpassword: the client key's)
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def redact(url: str) -> str:
    """The URL without its passwords, for messages and logs: the user part's password, and the value of each
    `password` and `sslpassword` parameter however its name is percent-encoded, read `***`; the rest is kept as
    given (a percent-encoded user name too).

    A password may hold what a URL's parsers read as its end: a `#` (libpq knows no fragment: it is the
    password's), an `@`, `?` or `=` (libpq ends the user part at its first `@`, asyncpg at the first `@` of
    what comes before a `/`, `?` or `#`). So the user part, where it has a `:`, is taken to go on to the last
    `@` before the first `/` (or before the first `=`, for a password with a `/`): none of the password shows,
    whichever way the URL is read.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo = ""
    ends = [rest.rfind("@", 0, _find(rest, "/")), rest.rfind("@", 0, _find(rest, "="))]
    if max(ends) >= 0 and ":" in rest[: max(ends)]:
        user = rest[: max(ends)].partition(":")[0]
        userinfo, rest = f"{user}:***@", rest[max(ends) + 1 :]
    elif "@" in (netloc := urlsplit(f"{scheme}://{rest}").netloc):  # a user without a password
        userinfo, rest = netloc.rpartition("@")[0] + "@", rest[len(netloc.rpartition("@")[0]) + 1 :]
    path, question, query = rest.partition("?")
    return f"{scheme}://{userinfo}{path}{question}{_redact_query(query)}"


def _find(text: str, char: str) -> int:
    """Where `char` first is in `text`; its length when nowhere."""
    found = text.find(char)
    return len(text) if found < 0 else found


def _redact_query(query: str) -> str:
    """A URL's query with the value of each parameter of `SECRET_PARAMETERS` read `***` (a name is compared once
    percent-decoded, as asyncpg's `parse_qs` reads it)."""
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        secret = unquote_plus(name).strip().lower() in SECRET_PARAMETERS
        pairs.append(f"{name}{equals}***" if secret and equals else pair)
    return "&".join(pairs)
