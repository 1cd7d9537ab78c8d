"""Where a push may go: one reading of a callback URL, and which addresses it may reach.

The dispatcher's HTTP client (Rust's url crate, WHATWG rules) and Python's urlsplit disagree on
URLs such as ``http://127.0.0.2:80\\@localhost:1/`` (the backslash ends the authority for one and
not for the other), on numeric hosts (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1`` are
all 127.0.0.1 to WHATWG and to inet_aton, names or errors to others), and on a host's
percent-encoding. A guard that checks one reading while the client acts on another holds
nothing, so ``parse_callback_url`` accepts only the URLs every common parser reads alike and
hands back one canonical form: it is checked at PUT time and again before each delivery, and
that form is what the client is given.

``CallbackPolicy.refusal`` decides an address: denied networks (with the IPv4 address an IPv6
one carries, IPv4-mapped, NAT64, 6to4, Teredo, IPv4-compatible, checked against the IPv4
lists), and, when set, the only networks allowed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from app.domain.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# What [push] deny-private-callbacks adds: the broker's own host and its internal networks.
PRIVATE_NETWORKS = (
    "127.0.0.0/8",  # loopback
    "::1/128",  # loopback
    "10.0.0.0/8",  # RFC 1918
    "172.16.0.0/12",  # RFC 1918
    "192.168.0.0/16",  # RFC 1918
    "100.64.0.0/10",  # CGNAT (RFC 6598)
    "fc00::/7",  # unique local
    "0.0.0.0/8",  # "this host": the broker's own, on Linux
    "::/128",  # unspecified
)

DEFAULT_PORTS = {"http": 80, "https": 443}

# A host that is a name: DNS labels of letters, digits, hyphens (and underscores, which
# container names carry), dot-separated; no trailing dot (read differently by resolvers).
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# WHATWG reads a host whose last label is a number (decimal, or 0x hex) as an IPv4 address;
# inet_aton does too. Only the dotted-quad of four decimals without leading zeros is unambiguous.
_NUMERIC_LABEL = re.compile(r"(?:[0-9]+|0x[0-9a-f]*)")
_CANONICAL_IPV4 = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}"
    r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
)
_PORT = re.compile(r"[1-9][0-9]{0,4}")
# Printable ASCII but space, backslash and '#' (a fragment is never sent; '\\' is '/' to
# WHATWG in a path or authority and a plain character to others).
_URL_CHARS = re.compile(r"[!-~]*")

# The well-known NAT64 prefix and the local-use one (RFC 8215) in its /96 form.
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/96"))
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


@dataclass(frozen=True, slots=True)
class CallbackUrl:
    """A callback URL as every parser reads it."""

    scheme: str  # http or https
    host: str  # a lower-case name, or an address in its canonical text (no brackets)
    port: int
    target: str  # path and query, as the request line carries them
    address: IPAddress | None  # the host, when it is an address

    @property
    def url(self) -> str:
        """The canonical form: what the HTTP client is given."""
        host = f"[{self.host}]" if isinstance(self.address, ipaddress.IPv6Address) else self.host
        port = "" if DEFAULT_PORTS[self.scheme] == self.port else f":{self.port}"
        return f"{self.scheme}://{host}{port}{self.target}"


def parse_callback_url(raw: str) -> CallbackUrl:
    """The callback URL ``raw`` in its one reading, or InvalidInput saying why it has none."""
    scheme, sep, rest = raw.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in DEFAULT_PORTS:
        raise InvalidInput("callbackUrl must be an absolute http(s) URL")
    if not _URL_CHARS.fullmatch(raw):
        raise InvalidInput(
            "callbackUrl must be printable ASCII without spaces or control characters "
            "(percent-encode the rest; an international name in its xn-- form)"
        )
    if "\\" in raw:
        raise InvalidInput("callbackUrl must not contain a backslash (parsers disagree on it)")
    if "#" in raw:
        raise InvalidInput("callbackUrl must not have a fragment (#...)")
    end = next((i for i, ch in enumerate(rest) if ch in "/?"), len(rest))
    authority, target = rest[:end], rest[end:]
    if "@" in authority:
        raise InvalidInput("callbackUrl must not carry user information (user@host)")
    if target.startswith("?") or not target:
        target = "/" + target
    host, port = _split_port(authority, DEFAULT_PORTS[scheme])
    address = _literal(host)
    if address is not None:
        host = str(address)
    else:
        _check_name(host)
        host = host.lower()
    return CallbackUrl(scheme, host, port, target, address)


def _split_port(authority: str, default: int) -> tuple[str, int]:
    if authority.startswith("["):
        host, bracket, after = authority.partition("]")
        if not bracket:
            raise InvalidInput("callbackUrl has an unclosed [ in its host")
        host += "]"
        if after and not after.startswith(":"):
            raise InvalidInput("callbackUrl has text after its [address]")
        port_text = after[1:] if after else None
    else:
        host, colon, port_text_ = authority.partition(":")
        port_text = port_text_ if colon else None
    if port_text is None:
        return host, default
    # No empty port, no leading zero, no sign: each is read differently by someone.
    if not _PORT.fullmatch(port_text) or int(port_text) > 65535:
        raise InvalidInput("callbackUrl's port must be a number from 1 to 65535")
    return host, int(port_text)


def _literal(host: str) -> IPAddress | None:
    """The address a host literally is (None: a name); refuses every form but the canonical."""
    if host.startswith("["):
        text = host[1:-1]
        if "%" in text:
            raise InvalidInput("callbackUrl must not carry an IPv6 zone (%...)")
        try:
            v6 = ipaddress.IPv6Address(text)
        except ValueError:
            raise InvalidInput(f"callbackUrl has an invalid IPv6 address {text!r}") from None
        if v6.ipv4_mapped is not None or (v6 in _IPV4_COMPATIBLE and int(v6) > 1):
            raise InvalidInput(
                "callbackUrl must give an IPv4 address as a.b.c.d, not inside an IPv6 one"
            )
        return v6
    lowered = host.lower()
    last = lowered.rsplit(".", 1)[-1] if lowered else lowered
    if _NUMERIC_LABEL.fullmatch(last) or (lowered.endswith(".") and _looks_numeric(lowered)):
        if not _CANONICAL_IPV4.fullmatch(lowered):
            raise InvalidInput(
                f"callbackUrl host {host!r} is not a canonical IPv4 address: write four "
                "decimal numbers without leading zeros (no decimal, octal, hex or short forms)"
            )
        return ipaddress.IPv4Address(lowered)
    return None


def _looks_numeric(host: str) -> bool:
    """A host that a trailing dot would turn into an address for some parsers (127.0.0.1.)."""
    return bool(_NUMERIC_LABEL.fullmatch(host.rstrip(".").rsplit(".", 1)[-1]))


def _check_name(host: str) -> None:
    if not host:
        raise InvalidInput("callbackUrl must name a host")
    if "%" in host:
        raise InvalidInput("callbackUrl's host must not be percent-encoded")
    if host.endswith("."):
        raise InvalidInput("callbackUrl's host must not end with a dot")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in host.lower().split(".")):
        raise InvalidInput(
            f"callbackUrl host {host!r} is not a valid name (letters, digits, hyphens, "
            "dot-separated labels)"
        )


# -- Which addresses a callback may reach ---------------------------------------------------------


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address leads to (a translator or tunnel delivers there)."""
    found: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    nat64 = any(address in prefix for prefix in _NAT64)
    if nat64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return tuple(found)


def _kind(address: IPAddress) -> str:
    """A word for the operator: what such an address usually is."""
    for kind in ("link-local", "loopback", "multicast", "unspecified", "private"):
        if getattr(address, "is_" + kind.replace("-", "_")):
            return f"{kind}, "
    return ""


@dataclass(frozen=True, slots=True)
class CallbackPolicy:
    """[push] deny-callback-networks, deny-private-callbacks and allow-callback-networks."""

    denied: tuple[IPNetwork, ...]
    allowed: tuple[IPNetwork, ...] = ()  # empty: every address not denied

    @classmethod
    def of(
        cls, deny: Iterable[str], *, deny_private: bool = False, allow: Iterable[str] = ()
    ) -> CallbackPolicy:
        denied = [*deny, *(PRIVATE_NETWORKS if deny_private else ())]
        return cls(
            tuple(ipaddress.ip_network(n, strict=False) for n in denied),
            tuple(ipaddress.ip_network(n, strict=False) for n in allow),
        )

    def refusal(self, address: IPAddress) -> str | None:
        """Why a callback may not reach ``address`` (None: it may)."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            # A socket connects to the IPv4 address itself.
            address = address.ipv4_mapped
        reached: tuple[IPAddress, ...] = (address,)
        if isinstance(address, ipaddress.IPv6Address):
            reached += embedded_ipv4(address)
        for ip in reached:
            for network in self.denied:
                if ip in network:
                    via = "" if ip == address else f" (it leads to {ip})"
                    return (
                        f"callback address {address}{via} is {_kind(ip)}in a denied "
                        f"network ({network})"
                    )
        if self.allowed and not any(address in network for network in self.allowed):
            return f"callback address {address} is outside [push] allow-callback-networks"
        return None

    def literal_refusal(self, url: CallbackUrl) -> str | None:
        """Why a URL whose host is an address may not be called (None: it may, or a name:
        a name is checked when a delivery resolves it)."""
        return None if url.address is None else self.refusal(url.address)
