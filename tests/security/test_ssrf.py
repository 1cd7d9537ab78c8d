"""The SSRF guard holds: a callback URL has one reading (every form that two parsers read
differently is a 400 at PUT and refused at delivery), a name is resolved once and the
connection goes to the address that was checked, and the networks configured hold against
every trick, checked against real listeners on loopback."""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from app.api.app import create_app
from app.config import (
    DEFAULT_DENIED_CALLBACK_NETWORKS,
    Config,
    ConfigError,
    PushConfig,
    load_config_text,
)
from app.dispatch import http as push_http
from app.dispatch.http import Poster
from app.domain.callbacks import CallbackPolicy, parse_callback_url
from app.domain.errors import InvalidInput
from app.runtime import Runtime
from tests.helpers.push import publish
from tests.helpers.waiting import eventually

# -- One reading of a URL ---------------------------------------------------------------------

# Each a URL that WHATWG (the dispatcher's client) and Python read differently, or that
# getaddrinfo / inet_aton read as an address: all refused, with the reason's key words.
AMBIGUOUS = [
    ("http://127.0.0.2:8080\\@localhost:1/", "backslash"),
    ("http://localhost\\.127.0.0.2/", "backslash"),
    ("http://h.example/a\\b", "backslash"),
    ("http://user@h.example/", "user information"),
    ("http://user:pw@127.0.0.1/", "user information"),
    ("http://127.0.0.1:1@127.0.0.2/", "user information"),
    ("http://2130706433/", "canonical IPv4"),
    ("http://0177.0.0.1/", "canonical IPv4"),
    ("http://0x7f.1/", "canonical IPv4"),
    ("http://0x7f000001/", "canonical IPv4"),
    ("http://127.1/", "canonical IPv4"),
    ("http://127.0.1/", "canonical IPv4"),
    ("http://127.000.000.001/", "canonical IPv4"),
    ("http://127.0.0.1./", "canonical IPv4"),
    ("http://h.example.123/", "canonical IPv4"),
    ("http://[::ffff:127.0.0.1]/", "inside an IPv6"),
    ("http://[::ffff:7f00:1]/", "inside an IPv6"),
    ("http://[::127.0.0.1]/", "inside an IPv6"),
    ("http://[fe80::1%25eth0]/", "zone"),
    ("http://%31%32%37.0.0.1/", "canonical IPv4"),
    ("http://loc%61lhost/", "percent-encoded"),
    ("http://h.example./", "end with a dot"),
    ("http://h .example/", "printable ASCII"),
    ("http://h.example/\t", "printable ASCII"),
    ("http://h.example/\r\nX: y", "printable ASCII"),
    (" http://h.example/", "absolute"),
    ("http://bücher.example/", "printable ASCII"),
    ("http://h.example:/", "port"),
    ("http://h.example:080/", "port"),
    ("http://h.example:65536/", "port"),
    ("http:/h.example/", "absolute"),
    ("ftp://h.example/", "absolute"),
    ("http://h.example/#x", "fragment"),
    ("http:///x", "name a host"),
]


@pytest.mark.parametrize(("url", "reason"), AMBIGUOUS)
def test_an_ambiguous_url_has_no_reading(url: str, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        parse_callback_url(url)


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://h.example", "http://h.example/"),
        ("HTTPS://H.Example:443/a?b=1", "https://h.example/a?b=1"),
        ("http://127.0.0.1:8080?x=1", "http://127.0.0.1:8080/?x=1"),
        ("http://[0:0::1]:81/in", "http://[::1]:81/in"),
        ("http://my_service:8080/hook", "http://my_service:8080/hook"),
        ("http://10.0.0.1/a%5Cb", "http://10.0.0.1/a%5Cb"),
    ],
)
def test_a_plain_url_reads_one_way(url: str, canonical: str) -> None:
    assert parse_callback_url(url).url == canonical


def test_a_seeded_callback_is_read_the_same_way() -> None:
    text = (
        "[initial-channels]\nc1=C\n[initial-channel-tokens]\nc1=ct\n"
        "[initial-consumers]\nk1=http://0x7f.1/hook\n[k1]\ntoken=kt\nchannel=c1\n"
    )
    with pytest.raises(ConfigError, match=r"\[initial-consumers\] k1.*canonical IPv4"):
        load_config_text(text)


# -- Which addresses ----------------------------------------------------------------------------

DEFAULT = CallbackPolicy.of(DEFAULT_DENIED_CALLBACK_NETWORKS)
PRIVATE = CallbackPolicy.of(DEFAULT_DENIED_CALLBACK_NETWORKS, deny_private=True)
NOTHING_DENIED_BUT_PRIVATE = CallbackPolicy.of((), deny_private=True)
ONLY_ONE = CallbackPolicy.of(DEFAULT_DENIED_CALLBACK_NETWORKS, allow=["127.0.0.1/32"])


@pytest.mark.parametrize(
    ("policy", "address", "refused"),
    [
        (DEFAULT, "169.254.169.254", "link-local"),
        (DEFAULT, "::ffff:169.254.169.254", "link-local"),
        (DEFAULT, "64:ff9b::a9fe:a9fe", "64:ff9b::a9fe:0/112"),
        (DEFAULT, "2002:a9fe:a9fe::1", "leads to 169.254.169.254"),
        (DEFAULT, "2001:0:4136:e378:8000:63bf:5601:5601", "leads to 169.254"),  # Teredo
        (DEFAULT, "fe80::1", "link-local"),
        (DEFAULT, "fd00:ec2::254", "fd00:ec2::254/128"),
        (DEFAULT, "100.100.100.200", "100.100.100.200/32"),
        (DEFAULT, "0.0.0.0", "unspecified"),
        (DEFAULT, "::", "unspecified"),
        (DEFAULT, "255.255.255.255", "240.0.0.0/4"),
        (DEFAULT, "224.0.0.1", "multicast"),
        (DEFAULT, "ff02::1", "multicast"),
        (DEFAULT, "127.0.0.1", None),
        (DEFAULT, "10.1.2.3", None),
        (DEFAULT, "93.184.216.34", None),
        (PRIVATE, "127.0.0.2", "loopback"),
        (PRIVATE, "::1", "loopback"),
        (PRIVATE, "10.1.2.3", "10.0.0.0/8"),
        (PRIVATE, "172.31.0.1", "172.16.0.0/12"),
        (PRIVATE, "192.168.1.1", "192.168.0.0/16"),
        (PRIVATE, "100.64.0.1", "100.64.0.0/10"),
        (PRIVATE, "fd12::1", "fc00::/7"),
        (PRIVATE, "::ffff:10.0.0.1", "10.0.0.0/8"),
        (PRIVATE, "64:ff9b::a00:1", "leads to 10.0.0.1"),
        (PRIVATE, "2002:7f00:1::", "leads to 127.0.0.1"),
        (PRIVATE, "93.184.216.34", None),
        (PRIVATE, "64:ff9b:1::a9fe:a9fe", "leads to 169.254.169.254"),  # local-use NAT64
        (PRIVATE, "64:ff9b:1::a00:1", "leads to 10.0.0.1"),
        (NOTHING_DENIED_BUT_PRIVATE, "0.0.0.0", "0.0.0.0/8"),
        (NOTHING_DENIED_BUT_PRIVATE, "::", "::/128"),
        (ONLY_ONE, "127.0.0.1", None),
        (ONLY_ONE, "::ffff:127.0.0.1", None),
        (ONLY_ONE, "127.0.0.2", "outside"),
        (ONLY_ONE, "::1", "outside"),
        (ONLY_ONE, "64:ff9b::7f00:1", "outside"),
        (ONLY_ONE, "169.254.169.254", "link-local"),
    ],
)
def test_an_address_is_decided_by_the_networks(
    policy: CallbackPolicy, address: str, refused: str | None
) -> None:
    refusal = policy.refusal(ipaddress.ip_address(address))
    if refused is None:
        assert refusal is None
    else:
        assert refusal is not None and refused in refusal, refusal


# -- Real listeners -----------------------------------------------------------------------------


@dataclass
class Listener:
    """A real HTTP server on one loopback address that counts the connections it accepts."""

    url: str
    connections: int = 0
    hosts: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@contextmanager
def listening(address: str, port: int = 0) -> Iterator[Listener]:
    listener = Listener(url="")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            with listener.lock:
                listener.connections += 1
            super().setup()

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's naming
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with listener.lock:
                listener.hosts.append(self.headers.get("Host", ""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    listener.url = f"http://{address}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name=f"listener-{address}", daemon=True)
    thread.start()
    try:
        yield listener
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def allowed() -> Iterator[Listener]:
    with listening("127.0.0.1") as listener:
        yield listener


@pytest.fixture
def forbidden() -> Iterator[Listener]:
    with listening("127.0.0.2") as listener:
        yield listener


@pytest.fixture
def extra_config() -> str:
    return (
        "[broker]\nmax-retry=0\nretry-backoff-delays-in-seconds=1\n"
        "rational-delay-in-seconds=1\nmax-workers=4\n"
        "[consumer-connection]\nconnection-timeout-in-seconds=2\n"
        "[push]\nallow-callback-networks=127.0.0.1/32\n"
    )


@asynccontextmanager
async def broker(config: Config) -> AsyncIterator[httpx.AsyncClient]:
    rt = Runtime(config, run_sweeper=True, run_dispatcher=True)
    await rt.start()
    try:
        transport = httpx.ASGITransport(app=create_app(config, rt))
        async with httpx.AsyncClient(transport=transport, base_url="http://broker.test") as http:
            yield http
    finally:
        await rt.stop()


def tricks(target: Listener, port: int) -> list[str]:
    """Every way we know to write 127.0.0.2:port, or to send a parser there."""
    return [
        f"{target.url}/plain",
        f"http://127.0.0.2:{port}\\@localhost:1/",
        f"http://127.0.0.2:{port}\\@127.0.0.1:1/",
        f"http://127.0.0.1:1@127.0.0.2:{port}/",
        f"http://2130706434:{port}/",
        f"http://0177.0.0.2:{port}/",
        f"http://0x7f.0.0.2:{port}/",
        f"http://0x7f000002:{port}/",
        f"http://127.2:{port}/",
        f"http://127.0.2:{port}/",
        f"http://127.0.0.2.:{port}/",
        f"http://[::ffff:127.0.0.2]:{port}/",
        f"http://[::ffff:7f00:2]:{port}/",
        f"http://[::127.0.0.2]:{port}/",
        f"http://[64:ff9b::7f00:2]:{port}/",
        f"http://%31%32%37.0.0.2:{port}/",
        f"http://127.0.0.2:{port}%2f@127.0.0.1/",
    ]


def port_of(listener: Listener) -> int:
    return int(listener.url.rsplit(":", 1)[1])


async def test_the_backslash_url_and_every_non_canonical_form_are_a_400_at_put(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.put("/channel/c1", data={"token": "ct"})).status_code == 200
    for n, (url, reason) in enumerate(AMBIGUOUS):
        if url != url.strip():
            continue  # the API trims a form field's ends: what it stores has none
        r = await client.put(f"/channel/c1/consumer/k{n}", data={"token": "kt", "callbackUrl": url})
        assert r.status_code == 400, (url, r.text)
        assert reason in r.json()["detail"], (url, r.text)
    # A denied address written plainly is a 400 too: it is outside the allow list.
    r = await client.put(
        "/channel/c1/consumer/k", data={"token": "kt", "callbackUrl": "http://127.0.0.2:9/"}
    )
    assert r.status_code == 400 and "allow-callback-networks" in r.json()["detail"], r.text


async def test_with_an_allow_list_no_trick_reaches_another_loopback_address(
    config: Config, allowed: Listener, forbidden: Listener
) -> None:
    """allow-callback-networks=127.0.0.1/32: every trick for 127.0.0.2 is refused, at PUT or
    at delivery (a name, or a URL stored before this check), while 127.0.0.1 is delivered."""
    port = port_of(forbidden)
    async with broker(config) as http:
        assert (await http.put("/channel/c1", data={"token": "ct"})).status_code == 200
        assert (await http.put("/producer/p1", data={"token": "pt"})).status_code == 200
        accepted = []
        for n, url in enumerate(tricks(forbidden, port)):
            r = await http.put(
                f"/channel/c1/consumer/t{n}", data={"token": "kt", "callbackUrl": url}
            )
            if r.status_code != 400:
                accepted.append(url)
        r = await http.put(
            "/channel/c1/consumer/ok", data={"token": "kt", "callbackUrl": allowed.url + "/ok"}
        )
        assert r.status_code == 200, r.text
        await publish(http, b"x", "m-1")
        # Every consumer's job of the message settled: each delivery was tried or refused.

        async def settled() -> bool:
            r = await http.get("/channel/c1/message/m-1")
            assert r.status_code == 200, r.text
            jobs = r.json()["Jobs"]
            assert all(job["Status"] in ("DELIVERED", "DEAD") for job in jobs), jobs
            return True

        await eventually(settled, 20, what="every job of m-1 DELIVERED or DEAD")
    assert forbidden.connections == 0, accepted
    assert allowed.hosts == [f"127.0.0.1:{port_of(allowed)}"]
    assert accepted == [], "accepted at PUT"

    # The dispatcher's own check, for URLs that never went through a PUT (rows written by an
    # older version) and for a name that resolves there.
    async def resolve(host: str, port: int) -> Sequence[str]:
        return {"sneaky.test": ["127.0.0.2"], "both.test": ["127.0.0.1", "127.0.0.2"]}[host]

    poster = Poster(2, 4, config.push, resolve=resolve)
    try:
        urls = [
            *tricks(forbidden, port),
            f"http://sneaky.test:{port}/",
            f"http://both.test:{port}/",
        ]
        for url in urls:
            answer = await poster.post(url, b"x", {})
            assert answer.refused and answer.status is None, (url, answer)
    finally:
        await poster.close()
    assert forbidden.connections == 0


class Rebinding:
    """A resolver whose answers change from one look-up to the next (DNS rebinding)."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        assert host == "rebind.test"
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return [answer]


# 127.0.0.2 stands for a metadata address: denied, the rest allowed.
DENY_ONE = PushConfig(deny_callback_networks=(*DEFAULT_DENIED_CALLBACK_NETWORKS, "127.0.0.2/32"))


async def test_a_name_is_resolved_once_and_connected_to_as_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name that answers an allowed address and then a denied one (a rebinding attack) is
    delivered to the checked address with its own Host header; once its check expires, the
    denied answer is refused; in the opposite order, the first delivery is refused and the
    next goes to the allowed address. The denied address is never connected to."""
    # Every delivery checks again: each look-up may answer differently.
    monkeypatch.setattr(push_http, "RESOLVED_FOR", 0.0)
    # Both listeners on one port number, so that the URL fits either address.
    with listening_pair() as (first, second):
        port = port_of(first)
        url = f"http://rebind.test:{port}/hook"
        for order, expected in (
            (("127.0.0.1", "127.0.0.2"), (False, True)),
            (("127.0.0.2", "127.0.0.1"), (True, False)),
        ):
            resolver = Rebinding(*order)
            poster = Poster(2, 4, DENY_ONE, resolve=resolver)
            try:
                answer = await poster.post(url, b"x", {})
                assert answer.refused is expected[0], answer
                # One look-up per check: the client did not resolve the name again.
                assert resolver.asked == 1
                answer = await poster.post(url, b"x", {})
                assert answer.refused is expected[1], answer
                assert resolver.asked == 2
            finally:
                await poster.close()
        assert second.connections == 0
        # Both deliveries that went out reached 127.0.0.1, naming the callback's host.
        assert first.hosts == [f"rebind.test:{port}"] * 2


@contextmanager
def listening_pair() -> Iterator[tuple[Listener, Listener]]:
    """Listeners on 127.0.0.1 and 127.0.0.2 sharing a port number."""
    for _ in range(20):
        with listening("127.0.0.1") as first:
            try:
                pair = listening("127.0.0.2", port_of(first))
                second = pair.__enter__()
            except OSError:
                continue
            try:
                yield first, second
            finally:
                pair.__exit__(None, None, None)
            return
    raise AssertionError("no port free on both 127.0.0.1 and 127.0.0.2")
