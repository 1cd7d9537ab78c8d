"""Garbage over NATS, against real JetStream and against the bridge (both transports): bad pull
request bodies, bad subjects, bad API requests and bad acks get what nats-server answers (a
status, a JSON error, or nothing), and afterwards the bridge still serves a normal nats-py fetch
and applies its ack, with no job left in flight by the garbage.

The scenario runs once against nats-server 2.15 with JetStream (stream `orders`, durable pull
consumer `workers` configured like the broker's seeded one) and once per transport against the
bridge; each observation is then its own test, so a known difference is one strict xfail.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from app.bridge import protocol as p
from app.runtime import Runtime
from tests.bridge.conftest import BridgeFactory, seed, uncapped_only
from tests.helpers.natsproc import NatsServer
from tests.helpers.pull import status_counts
from tests.helpers.side_by_side import Publish, http_publisher, on_jetstream

API = "$JS.API"
# What comes back after garbage acks is told apart by time: a NAK'd job before the ack wait
# (at once on JetStream, after the broker's 1 s backoff), a pending one after it (on the broker
# within one 1 s sweep of its lease ending). A 4 s ack wait leaves every such moment at least a
# second from the edge of the window it must fall in; with the suite's 2 s one, a moment of
# load on the machine moved redeliveries across an edge.
ACK_WAIT = 4
NEXT = f"{API}.CONSUMER.MSG.NEXT.orders.workers"
Seen = list[tuple[Any, ...]]

LONG_NAME = "x" * 1_000  # past VARCHAR(255); a subject stays under nats-server's 4 KB line
WINDOW = 0.4
# The longest wait for the status line a pull request of PULL_BODIES ends with.
ENDS_WITHIN = 10.0
SHORT = b'"expires": 200000000'  # 0.2 s, so a request that is not refused ends by itself

# MSG.NEXT bodies the server refuses at once (400, 409) or that end by themselves (408).
PULL_BODIES: dict[str, bytes] = {
    "invalid-json": b"{bad",
    "truncated-json": b'{"batch": 1',
    "batch-string": b'{"batch": "x", ' + SHORT + b"}",
    "batch-negative": b'{"batch": -1, ' + SHORT + b"}",
    "batch-zero": b'{"batch": 0, ' + SHORT + b"}",
    "batch-huge": b'{"batch": 1000000000000000000000000000000, ' + SHORT + b"}",
    "batch-int64-max": b'{"batch": 9223372036854775807, ' + SHORT + b"}",
    "batch-float": b'{"batch": 1.5, ' + SHORT + b"}",
    "batch-bool": b'{"batch": true, ' + SHORT + b"}",
    "batch-object": b'{"batch": {"x": 1}, ' + SHORT + b"}",
    "expires-negative": b'{"batch": 1, "expires": -5, "no_wait": true}',
    "expires-negative-waiting": b'{"batch": 1, "expires": -5}',
    "expires-huge": b'{"batch": 1, "expires": 1000000000000000000000000000000}',
    "expires-float": b'{"batch": 1, "expires": 1e30}',
    "expires-string": b'{"batch": 1, "expires": "1s"}',
    "max-bytes-negative": b'{"batch": 1, "max_bytes": -1, ' + SHORT + b"}",
    "max-bytes-huge": b'{"batch": 1, "max_bytes": 1000000000000000000000000000000}',
    "no-wait-nul-string": b'{"batch": 1, "no_wait": "\\u0000"}',
    "heartbeat-negative": b'{"batch": 1, "idle_heartbeat": -1, ' + SHORT + b"}",
    "heartbeat-huge": b'{"batch": 1, "idle_heartbeat": 1000000000000000000000, ' + SHORT + b"}",
    "nul-escaped-in-string": b'{"batch": 1, "group": "a\\u0000b", "no_wait": true}',
    "nul-raw-in-string": b'{"batch": 1, "group": "a\x00b", "no_wait": true}',
    "nul-raw-in-key": b'{"batch": 1, "a\x00b": 1, "no_wait": true}',
    "control-raw-in-string": b'{"batch": 1, "group": "\x1f", "no_wait": true}',
    "control-outside-string": b'{"batch": \x01}',
    "bad-utf8-in-string": b'{"batch": 1, "group": "\xff\xfe", "no_wait": true}',
    "nul-after-object": b'{"batch": 1, "no_wait": true}\x00',
    "junk-after-object": b'{"batch": 1, "no_wait": true} junk',
    "deep-nesting": b'{"a": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
}
# Bodies that are not JSON objects: nats-server reads an integer batch (strconv.Atoi) or takes
# a batch of one with no expiry, so these wait until messages come (published after WINDOW).
WAITING_BODIES: dict[str, bytes] = {
    "raw-nul": b"\x00\x00",
    "random-bytes": b"\xff\xfe\x80\x01",
    "array": b"[1, 2]",
    "null": b"null",
    "int-past-int64": b"99999999999999999999999",
    "int-5000-digits": b"9" * 5_000,
    "plus-int": b"+2",
}

WAITING_MESSAGES = len(WAITING_BODIES) + 1  # "+2" asks for two

# Pull and INFO requests naming streams and consumers that cannot exist.
BAD_NAMES: dict[str, tuple[str, str]] = {
    "nul-stream": ("or\x00ders", "workers"),
    "nul-consumer": ("orders", "work\x00ers"),
    "long-stream": (LONG_NAME, "workers"),
    "long-consumer": ("orders", LONG_NAME),
}
INFO_BODIES: dict[str, bytes] = {"junk": b"\x00\xff{bad", "json": b'{"offset": -1}'}
# (With the subject `orders` where the garbage is elsewhere: the broker has a second channel.)
NAMES_BODIES: dict[str, bytes] = {
    "invalid-json": b"{bad",
    "offset-negative": b'{"subject": "orders", "offset": -1}',
    "offset-huge": b'{"subject": "orders", "offset": 1000000000000000000000000000000}',
    "offset-string": b'{"subject": "orders", "offset": "x"}',
    "subject-nul": b'{"subject": "or\\u0000ders"}',
    "subject-number": b'{"subject": 5}',
    "array": b"[]",
}

# Ack payloads, each sent to a delivery of its own: the reply, and what becomes of the message.
ACK_PAYLOADS: dict[str, bytes] = {
    "ack": b"+ACK",
    "plus-nak-bad-json": b"+NAK {bad json",
    "nak-bad-json": b"-NAK {bad json",
    "nak-delay-past-int64": b'-NAK {"delay": 1000000000000000000000000000000}',
    "nak-float-delay": b'-NAK {"delay": 1.5e30}',
    "nak-negative-delay": b'-NAK {"delay": -5}',
    "nak-duration-past-int64": b"-NAK 99999999999999h",
    "nak-bad-duration": b"-NAK 5 parsecs",
    "term-nul": b"+TERM a\x00b",
    "term-bad-utf8": b"+TERM \xff\xfe",
    "progress": b"+WPI",
    "progress-junk": b"+WPI junk",
    "ack-nul": b"+ACK\x00",
    "random-bytes": b"\x00\xff\xfe\x80",
    "next-bad-json": b"+NXT {bad",
    "next-huge-batch": b'+NXT {"batch": 1000000000000000000000000000000}',
}
ACK_SUBJECT_PAYLOADS: dict[str, bytes] = {
    "ack": b"+ACK",
    "nak": b"-NAK",
    "term": b"+TERM x",
    "progress": b"+WPI",
}


def ack_subjects(prefix: str, stream: str, consumer: str, ts: str) -> dict[str, str]:
    """Ack subjects of the real consumer that name no delivery: malformed tokens, numbers past
    int64 (or an attempt past the INTEGER column), sequences nobody was given."""
    base = f"{prefix}.{stream}.{consumer}"
    return {
        "non-numeric": f"{base}.x.1.1.{ts}.0",
        "too-few-tokens": f"{base}.1.2",
        "too-many-tokens": f"{base}.1.999999.1.{ts}.0.7.8",
        "seq-past-int64": f"{base}.1.99999999999999999999999.1.{ts}.0",
        "seq-int64-max": f"{base}.1.9223372036854775807.1.{ts}.0",
        "delivered-past-int64": f"{base}.99999999999999999999.999999.1.{ts}.0",
        "delivered-past-int32": f"{base}.{2**40}.999999.1.{ts}.0",
        "negative": f"{base}.1.-5.1.{ts}.0",
        "seq-5000-digits": f"{base}.1.{'9' * 3_000}.1.{ts}.0",
    }


def foreign_ack_subjects(prefix: str, ts: str) -> dict[str, str]:
    """Ack subjects naming streams and consumers that do not exist (nats-server has nobody
    listening on them, the bridge listens on the whole prefix): sent, never compared."""
    return {
        "unknown-stream": f"{prefix}.nostream.workers.1.999999.1.{ts}.0",
        "nul-consumer": f"{prefix}.orders.wo\x00rkers.1.999999.1.{ts}.0",
        "long-consumer": f"{prefix}.orders.{LONG_NAME}.1.999999.1.{ts}.0",
    }


def observation_keys() -> list[str]:
    keys = [f"next:{label}" for label in PULL_BODIES]
    keys += [f"next:{label}" for label in WAITING_BODIES]
    keys += [f"next-then:{label}" for label in WAITING_BODIES]
    keys += [f"{kind}:{label}" for label in BAD_NAMES for kind in ("next-subject", "info")]
    keys += [f"info-body:{label}" for label in INFO_BODIES]
    keys += [f"names:{label}" for label in NAMES_BODIES]
    keys += ["leftovers"]
    keys += [f"{kind}:{label}" for label in ACK_PAYLOADS for kind in ("ack-reply", "ack-outcome")]
    keys += [
        f"ack-subject:{label}:{payload}"
        for label in ack_subjects("P", "s", "c", "0")
        for payload in ACK_SUBJECT_PAYLOADS
    ]
    keys += ["normal-fetch", "num-ack-pending"]
    return keys


# -- observing ----------------------------------------------------------------------------------


def summarize(msg: Msg) -> tuple[Any, ...]:
    headers = msg.headers or {}
    status = headers.get("Status")
    if status is None:
        return ("msg", msg.data.decode(errors="replace"))
    if status == "503":  # (no responders; nats-server 2.11+ adds a Nats-Subject header)
        return ("status", status)
    return ("status", status, headers.get("Description"))


async def drain(
    nc: Client,
    sub: Subscription,
    window: float,
    *,
    ack: bool = True,
    keep: bool = False,
    until_status: bool = False,
) -> Seen:
    """What arrives on `sub` within `window` (or, `until_status`, up to its first status line
    within it); deliveries are acked so nothing stays pending. The subscription ends unless
    `keep`."""
    seen: Seen = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window
    while (left := deadline - loop.time()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except NatsTimeoutError:
            break
        seen.append(summarize(msg))
        if ack and msg.reply:
            await nc.publish(msg.reply, b"")
        if until_status and seen[-1][0] == "status":
            break
    if not keep:
        await sub.unsubscribe()
    return seen


async def drain_all(
    nc: Client, subs: dict[str, Subscription], window: float, *, ack: bool = True
) -> dict[str, Seen]:
    """drain() of many subscriptions at once (one after another would let ack waits lapse)."""
    seen = await asyncio.gather(*(drain(nc, sub, window, ack=ack) for sub in subs.values()))
    return dict(zip(subs, seen, strict=True))


async def send_each(nc: Client, requests: dict[str, tuple[str, bytes]]) -> dict[str, Subscription]:
    """Publish each (subject, body), in order, with its own reply inbox: the inboxes' subs."""
    subs: dict[str, Subscription] = {}
    for label, (subject, body) in requests.items():
        inbox = nc.new_inbox()
        subs[label] = await nc.subscribe(inbox)
        await nc.publish(subject, body, reply=inbox)
    await nc.flush()
    return subs


async def request_each(nc: Client, requests: dict[str, tuple[str, bytes]]) -> dict[str, Seen]:
    """Publish each (subject, body) with its own reply inbox; what came back within WINDOW."""
    return await drain_all(nc, await send_each(nc, requests), WINDOW)


async def until_status(nc: Client, sub: Subscription) -> Seen:
    """What arrives on `sub` up to its first status line, waited for up to ENDS_WITHIN, and
    whatever follows it within WINDOW. Every body of PULL_BODIES ends with one status on
    nats-server (a refusal at once, or 408 at its 0.2 s expiry): waiting for that event, not
    for a fixed window, keeps a busy machine's late 408 from reading as no answer, and the
    window after it still sees a second line if one comes."""
    first = await drain(nc, sub, ENDS_WITHIN, keep=True, until_status=True)
    return first + await drain(nc, sub, WINDOW)


async def pull_garbage(nc: Client, publish: Publish) -> dict[str, Any]:
    out: dict[str, Any] = {}
    subs = await send_each(nc, {k: (NEXT, body) for k, body in PULL_BODIES.items()})
    refused = await asyncio.gather(*(until_status(nc, sub) for sub in subs.values()))
    out.update({f"next:{label}": seen for label, seen in zip(subs, refused, strict=True)})
    waiting = await send_each(nc, {k: (NEXT, body) for k, body in WAITING_BODIES.items()})
    await asyncio.sleep(WINDOW)
    for label, sub in waiting.items():
        out[f"next:{label}"] = await drain(nc, sub, 0.01, ack=False, keep=True)
    # Then one message per waiting request: each takes what it asked for, in arrival order.
    await publish([f"w{n}" for n in range(WAITING_MESSAGES)])
    for label, seen in (await drain_all(nc, waiting, 1.0)).items():
        out[f"next-then:{label}"] = seen
    return out


async def api_answer(nc: Client, subject: str, body: bytes, keys: tuple[str, ...]) -> Any:
    try:
        reply = await nc.request(subject, body, timeout=1)
    except NoRespondersError:
        return "no responders"
    except NatsTimeoutError:
        return "no reply"
    try:
        document = json.loads(reply.data)
    except ValueError:
        return ("not json", reply.data[:200])
    answer = {key: document.get(key) for key in keys}
    if isinstance(answer.get("error"), dict):
        # Codes, not wording: the bridge's descriptions are its own.
        answer["error"] = {k: answer["error"].get(k) for k in ("code", "err_code")}
    return answer


async def bad_subjects(nc: Client) -> dict[str, Any]:
    out: dict[str, Any] = {}
    nexts = await request_each(
        nc,
        {
            label: (f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}", b'{"batch": 1}')
            for label, (stream, consumer) in BAD_NAMES.items()
        },
    )
    for label, (stream, consumer) in BAD_NAMES.items():
        out[f"next-subject:{label}"] = nexts[label]
        subject = f"{API}.CONSUMER.INFO.{stream}.{consumer}"
        out[f"info:{label}"] = await api_answer(nc, subject, b"", ("type", "error"))
    for label, body in INFO_BODIES.items():
        subject = f"{API}.CONSUMER.INFO.orders.workers"
        out[f"info-body:{label}"] = await api_answer(nc, subject, body, ("type", "name", "error"))
    for label, body in NAMES_BODIES.items():
        out[f"names:{label}"] = await api_answer(
            nc, f"{API}.STREAM.NAMES", body, ("type", "total", "streams", "error")
        )
    return out


async def fetch_names(nc: Client, batch: int, expires: float) -> list[str]:
    """One pull request; every delivery is acked; the payloads that came."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    body = json.dumps({"batch": batch, "expires": int(expires * p.NANOS)}).encode()
    await nc.publish(NEXT, body, reply=inbox)
    seen = await drain(nc, sub, expires + 0.1)
    return [item[1] for item in seen if item[0] == "msg"]


async def ack_garbage(nc: Client, publish: Publish, ack_prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    labels = list(ACK_PAYLOADS)
    await publish([f"a-{label}" for label in labels])
    await asyncio.sleep(0.2)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    # (A batch of exactly the messages: a request still open after them would take their
    # redeliveries on a client-mode bridge, which cannot see the requester leave.)
    body = {"batch": len(labels), "expires": 2 * p.NANOS}
    await nc.publish(NEXT, json.dumps(body).encode(), reply=inbox)
    delivered: dict[str, Msg] = {}
    leftovers: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 3
    while len(delivered) < len(labels) and (left := deadline - loop.time()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except NatsTimeoutError:
            break
        if not msg.reply:
            continue  # the request's own end (a status)
        name = msg.data.decode()
        if name.startswith("a-"):
            delivered[name] = msg
        else:  # left over by the pull garbage (each is checked there)
            leftovers.append(name)
            await nc.publish(msg.reply, b"")
    await sub.unsubscribe()
    out["leftovers"] = sorted(leftovers)
    # (A message missing here went to a request of the pull garbage: reported as its outcome.)
    labels = [label for label in labels if f"a-{label}" in delivered]

    # T0: every payload to its own delivery, then garbage on the consumer's ack subjects.
    requests = {label: (delivered[f"a-{label}"].reply, ACK_PAYLOADS[label]) for label in labels}
    ts = next(iter(delivered.values())).reply.split(".")[-2]
    for label, subject in ack_subjects(ack_prefix, "orders", "workers", ts).items():
        for name, payload in ACK_SUBJECT_PAYLOADS.items():
            requests[f"subject:{label}:{name}"] = (subject, payload)
    for label, subject in foreign_ack_subjects(ack_prefix, ts).items():
        for name, payload in ACK_SUBJECT_PAYLOADS.items():
            requests[f"foreign:{label}:{name}"] = (subject, payload)
    replies = await request_each(nc, requests)
    for label in labels:
        out[f"ack-reply:{label}"] = replies[label]
    for key, seen in replies.items():
        if key.startswith("subject:"):
            out[f"ack-subject:{key.removeprefix('subject:')}"] = seen

    # What comes back: before the ack wait (a NAK: at once on JetStream, after the 1 s backoff
    # on the broker), after it (left pending), or never (acked, terminated).
    back_soon = await fetch_names(nc, len(labels), 1.9)
    await asyncio.sleep(ACK_WAIT)
    back_later = await fetch_names(nc, len(labels), 2.5)
    for label in ACK_PAYLOADS:
        name = f"a-{label}"
        out.setdefault(f"ack-reply:{label}", "not delivered")
        out[f"ack-outcome:{label}"] = (
            "not delivered"
            if label not in labels
            else "back before the ack wait"
            if name in back_soon
            else "back after the ack wait"
            if name in back_later
            else "not back"
        )
    return out


async def normal_fetch(nc: Client, publish: Publish) -> dict[str, Any]:
    """The plain nats-py way, after all the garbage: fetch one message and ack it."""
    js = nc.jetstream()
    psub = await js.pull_subscribe("orders", durable="workers", stream="orders")
    await publish(["after-garbage"])
    got = []
    for msg in await psub.fetch(1, timeout=5):
        got.append((msg.data.decode(), (await msg.ack_sync()).data))
    await asyncio.sleep(0.2)
    info = await psub.consumer_info()
    return {"normal-fetch": got, "num-ack-pending": info.num_ack_pending}


async def garbage_scenario(url: str, publish: Publish, ack_prefix: str) -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        out = await pull_garbage(nc, publish)
        out.update(await bad_subjects(nc))
        out.update(await ack_garbage(nc, publish, ack_prefix))
        out.update(await normal_fetch(nc, publish))
    finally:
        await nc.close()
    return out


# -- the runs -------------------------------------------------------------------------------------

# One worker's runs, by "jetstream" or (mode, backend): a test that needs a run this worker has
# not made makes it itself, so none depends on where xdist put another test.
_runs: dict[Any, dict[str, Any]] = {}


@pytest.fixture
def extra_config(cap: str) -> str:
    """The bridge's consumer with this module's ack wait (the JetStream one gets the same)."""
    return seed(cap, ack_wait=ACK_WAIT)


async def jetstream_run(server: NatsServer) -> dict[str, Any]:
    if "jetstream" not in _runs:
        async with on_jetstream(server, ack_wait=ACK_WAIT) as side:
            _runs["jetstream"] = await garbage_scenario(
                side.url, side.publish, p.DEFAULT_ACK_PREFIX
            )
    return _runs["jetstream"]


async def bridge_run(
    mode: str,
    backend: str,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> dict[str, Any]:
    bridge = await make_bridge(mode)
    _runs[mode, backend] = await garbage_scenario(
        hub.url, http_publisher(client), bridge.ack_prefix
    )
    return _runs[mode, backend]


# (mode or "*", key) -> why the bridge differs from nats-server today, and where the fix lies.
# None of these leaves a job leased or stops the bridge (test_garbage_... checks that).
_ACK_UNPARSED = (
    "an ack subject protocol.parse_ack_subject refuses (a token that is not a number in "
    "range, or an attempt past the INTEGER column) is dropped by bridge.py without a reply; "
    "nats-server, which reads digits with no range check, answers a -NAK or +WPI (and every "
    "payload when a token is not a number). Proposed, if ack-of-ack of garbage matters: "
    "bridge.py replies to such an ack as acks.py would to an unknown delivery"
)
KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {
    **{("*", f"ack-subject:non-numeric:{name}"): _ACK_UNPARSED for name in ACK_SUBJECT_PAYLOADS},
    **{
        ("*", f"ack-subject:{label}:{name}"): _ACK_UNPARSED
        for label in (
            "seq-past-int64",
            "delivered-past-int64",
            "delivered-past-int32",
            "negative",
            "seq-5000-digits",
        )
        for name in ("nak", "progress")
    },
}


def known(mode: str, key: str) -> str | None:
    return KNOWN_DIFFERENCES.get((mode, key)) or KNOWN_DIFFERENCES.get(("*", key))


@uncapped_only
@pytest.mark.parametrize("mode", ["client", "hybrid"])
async def test_garbage_gets_what_nats_server_answers(
    mode: str,
    backend: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
    runtime: Runtime,
) -> None:
    """Every observation but the known differences (test_known_difference) is nats-server's,
    and afterwards every job is DELIVERED or (terminated) DEAD: the garbage left nothing
    leased, and every ack was applied."""
    expected = await jetstream_run(jetstream_server)
    assert set(expected) == set(observation_keys())
    actual = await bridge_run(mode, backend, hub, make_bridge, client)
    mismatches = {
        key: {"nats-server": expected[key], "bridge": actual.get(key)}
        for key in observation_keys()
        if actual.get(key) != expected[key] and not known(mode, key)
    }
    terminated = sum(1 for label in ACK_PAYLOADS if label.startswith("term"))
    statuses = await status_counts(runtime)
    wanted = {
        "DELIVERED": WAITING_MESSAGES + len(ACK_PAYLOADS) - terminated + 1,
        "DEAD": terminated,
    }
    report = json.dumps(
        {"differences": mismatches, "job statuses": statuses}, indent=1, default=repr
    )
    assert (mismatches, statuses) == ({}, wanted), report


def _known_params() -> list[Any]:
    params = []
    for mode in ("client", "hybrid"):
        for key in observation_keys():
            reason = known(mode, key)
            if reason:
                mark = pytest.mark.xfail(strict=True, reason=reason)
                params.append(pytest.param(mode, key, id=f"{mode}-{key}", marks=mark))
    return params or [pytest.param("client", "none", marks=pytest.mark.skip(reason="none known"))]


@uncapped_only
@pytest.mark.parametrize(("mode", "key"), _known_params())
async def test_known_difference(
    mode: str,
    key: str,
    backend: str,
    jetstream_server: NatsServer,
    hub: NatsServer,
    make_bridge: BridgeFactory,
    client: httpx.AsyncClient,
) -> None:
    """A difference waiting on a fix outside the bridge's wire grammar: strict, so the fix
    shows (then remove it from KNOWN_DIFFERENCES). Its runs are this worker's, made here when
    test_garbage_... did not make them in this worker, so it can never skip its assertion."""
    expected = await jetstream_run(jetstream_server)
    actual = _runs.get((mode, backend)) or await bridge_run(mode, backend, hub, make_bridge, client)
    assert actual.get(key) == expected[key]


# -- the wire grammar's part, without servers ---------------------------------------------------


def test_acks_that_would_stall_the_ack_queue_are_read_as_nats_server_reads_them() -> None:
    """Each of these once reached the database as a value it refuses (an interval, an INTEGER
    or a NUL), and the ack queue retried the whole batch, every ack of the bridge with it,
    forever: the wire grammar now reads them as nats-server does."""
    # A NAK delay past int64 is a bad delay to Go: a plain NAK.
    assert p.parse_ack(b'-NAK {"delay": 1000000000000000000000000000000}').delay is None
    assert p.parse_ack(b"-NAK 99999999999999h").delay is None
    with pytest.raises(ValueError, match="invalid duration"):
        p.parse_go_duration("99999999999999h")
    assert p.parse_go_duration("-2562047h47m16.854775808s") == -(2**63)
    # A TERM reason keeps its text, with NUL (which PostgreSQL cannot store) as U+FFFD.
    assert p.parse_ack(b"+TERM a\x00b").reason == "a\ufffdb"
    # Ack subjects that can name no delivery: numbers past int64, an attempt past INTEGER,
    # names no channel or consumer can have.
    for subject in (
        "$JS.ACK.orders.workers.1.99999999999999999999999.1.0.0",
        f"$JS.ACK.orders.workers.{2**31}.5.1.0.0",
        f"$JS.ACK.orders.workers.1.{'9' * 3_000}.1.0.0",
        "$JS.ACK.orders.wo\x00rkers.1.5.1.0.0",
        f"$JS.ACK.orders.{'x' * 256}.1.5.1.0.0",
    ):
        assert p.parse_ack_subject("$JS.ACK", subject) is None, subject
    assert p.parse_ack_subject("$JS.ACK", f"$JS.ACK.orders.workers.{2**31 - 1}.5.1.0.0")


def test_pull_bodies_that_escaped_the_parser() -> None:
    # Nesting past Python's recursion limit raised RecursionError out of the pull engine.
    with pytest.raises(p.BadRequest, match="exceeded max depth"):
        p.parse_pull_request(b'{"a": ' + b"[" * 20_000 + b"]" * 20_000 + b"}")
    # An integer body strconv.Atoi cannot read is a batch of one (was a 409 for its size).
    assert p.parse_pull_request(b"99999999999999999999999").batch == 1
    assert p.parse_pull_request(b"9" * 5_000).batch == 1
    # A negative expiry is set, and already past (nats-server then answers 408, not 404).
    assert p.parse_pull_request(b'{"expires": -5, "no_wait": true}').expires > 0
