"""Where a push may not go: link-local addresses, where cloud metadata services answer
(169.254.169.254 and its IPv6 forms), so that a consumer's callback URL cannot make the
dispatcher read credentials off the machine it runs on. Loopback and private networks stay
allowed: a broker and its receivers often share one."""

from __future__ import annotations

import ipaddress

BLOCKED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",  # IPv4 link-local: AWS, GCP, Azure, OpenStack metadata
        "fe80::/10",  # IPv6 link-local
        "fd00:ec2::/32",  # AWS's IPv6 metadata endpoint
        "0.0.0.0/8",  # "this host" on some stacks
    )
)


def blocked_address(address: str) -> bool:
    """True for an address a push must not reach (IPv4-mapped IPv6 included)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in BLOCKED_NETWORKS)


def literal_host(host: str) -> str | None:
    """The host of a URL when it is an IP literal (brackets off), else None (a name)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        return None
    return bare
