"""The bridge's connections over TLS ([nats] tls-ca-file, tls-cert-file, tls-key-file): a real
nats-server whose client and leafnode listeners require TLS and a client certificate, all
signed by a CA made for the test (openssl)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.bridge.leaf import LeafCredentials, LeafError, LeafLink
from app.config import NatsConfig
from app.domain.jobs import JobStatus
from app.runtime import Runtime
from app.store.jobs import JobStore
from tests.bridge.conftest import BridgeFactory, publish_http, uncapped_only
from tests.helpers.natsproc import NatsServer


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(name: str, ca: Path, extensions: str, cwd: Path) -> None:
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=cwd,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", ca.name, "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by the CA;
    and a second CA nobody trusts."""
    root = tmp_path_factory.mktemp("pki")
    for ca in ("ca", "stranger-ca"):
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1",
            "-subj", f"/CN={ca}",
            cwd=root,
        )  # fmt: skip
    _signed(
        "server",
        root / "ca.pem",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        root,
    )
    _signed("bridge", root / "ca.pem", "extendedKeyUsage=clientAuth\n", root)
    return root


@pytest.fixture
def tls_server(pki: Path) -> Iterator[NatsServer]:
    """Client and leafnode listeners that require TLS and a certificate from the CA."""
    server = NatsServer(leafnodes=True)
    tls = (
        f'tls {{ cert_file: "{pki / "server.pem"}", key_file: "{pki / "server.key"}", '
        f'ca_file: "{pki / "ca.pem"}", verify: true }}'
    )
    server.conf.write_text(
        f"server_name: {server.name}\n"
        f"listen: 127.0.0.1:{server.port}\n"
        f"{tls}\n"
        f"leafnodes {{ listen: 127.0.0.1:{server.leaf_port}, {tls} }}\n"
    )
    server.start()
    yield server
    server.cleanup()


def tls_settings(pki: Path, server: NatsServer, ca: str = "ca.pem") -> NatsConfig:
    return NatsConfig(
        mode="hybrid",
        url=f"tls://127.0.0.1:{server.port}",
        leaf_url=f"tls://127.0.0.1:{server.leaf_port}",
        tls_ca_file=str(pki / ca),
        tls_cert_file=str(pki / "bridge.pem"),
        tls_key_file=str(pki / "bridge.key"),
    )


@uncapped_only
async def test_hybrid_bridge_over_tls(
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
    pki: Path,
    tls_server: NatsServer,
) -> None:
    """Both connections verify the server against the CA file and present the client
    certificate; a worker (nats-py over TLS) pulls a job the leafnode link delivered (its
    JetStream metadata is there) and acks it."""
    settings = tls_settings(pki, tls_server)
    await make_bridge(
        "hybrid",
        server=tls_server,
        url=settings.url,
        leaf_url=settings.leaf_url,
        tls_ca_file=settings.tls_ca_file,
        tls_cert_file=settings.tls_cert_file,
        tls_key_file=settings.tls_key_file,
    )
    import nats

    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    context.load_cert_chain(str(pki / "bridge.pem"), str(pki / "bridge.key"))
    nc = await nats.connect(settings.url, tls=context, allow_reconnect=False)
    try:
        psub = await nc.jetstream().pull_subscribe("orders", durable="workers", stream="orders")
        await publish_http(client, ["over-tls"])
        [msg] = await psub.fetch(1, timeout=5)
        assert msg.data == b"over-tls" and msg.metadata.stream == "orders"
        await msg.ack_sync(timeout=5)
    finally:
        await nc.close()
    async with runtime.db.transaction() as tx:
        job = await JobStore(tx).get(1)
    assert job is not None and job.status is JobStatus.DELIVERED


async def _session(link: LeafLink, url: str) -> None:
    stop = asyncio.Event()
    try:
        await asyncio.wait_for(link._session(url, stop), timeout=10)
    finally:
        stop.set()


def _link(pki: Path, url: str, ca: str) -> LeafLink:
    from app.bridge.client import tls_context

    context = tls_context(
        NatsConfig(
            tls_ca_file=str(pki / ca),
            tls_cert_file=str(pki / "bridge.pem"),
            tls_key_file=str(pki / "bridge.key"),
        )
    )
    return LeafLink(
        url,
        name="t",
        credentials=LeafCredentials(),
        subscriptions=[],
        on_message=lambda *_: None,
        on_interest=lambda *_: None,
        on_state=lambda _: None,
        tls=context,
    )


async def test_the_leaf_link_refuses_what_it_cannot_trust(
    pki: Path, tls_server: NatsServer, hub: NatsServer
) -> None:
    """A hub whose certificate is not from the configured CA is not spoken to; nor is a
    tls:// leaf-url whose hub offers no TLS (the link does not fall back to the clear)."""
    url = f"tls://127.0.0.1:{tls_server.leaf_port}"
    with pytest.raises(ssl.SSLCertVerificationError):
        await _session(_link(pki, url, "stranger-ca.pem"), url)
    plain = f"tls://127.0.0.1:{hub.leaf_port}"
    with pytest.raises(LeafError, match="does not offer TLS"):
        await _session(_link(pki, plain, "ca.pem"), plain)
    # And with the right CA the handshake completes (the session then runs until stopped).
    good = _link(pki, url, "ca.pem")
    stop = asyncio.Event()
    task = asyncio.create_task(good._session(url, stop))
    try:
        await asyncio.wait_for(good.connected.wait(), timeout=10)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=5)
