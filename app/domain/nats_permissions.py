"""The nats-server users and permissions of a bridge deployment (`webhook-broker nats-permissions`).

Pure: it turns the bridge's subjects and the pull consumers into nats-server configuration text.

Who may do what:
- The bridge's user answers the JetStream API and receives the acks: it subscribes to the API
  subjects it serves (consumer management included, for the bridge only) and to the ack
  subjects, each with the bridge's queue group; it publishes to inboxes (answers, deliveries)
  and the consumer advisories. The same user logs the hybrid leafnode link in: nats-server
  applies a user's subscribe permissions to what a leafnode imports and its publish
  permissions to what it exports.
- A worker's user (one per pull consumer, named `<channel>.<consumer>`) may request only its
  consumer's subjects: MSG.NEXT, CONSUMER.INFO, UNPIN, the channel's STREAM.INFO, and acks under
  its consumer's ack prefix; it reads only its own inbox, `_INBOX.<channel>.<consumer>.>`,
  and its consumer's advisories. Its client must set that inbox prefix (nats-py:
  `connect(inbox_prefix=...)`, nats.js: `inboxPrefix`).
- Push consumers (a `deliver_subject`): the bridge publishes deliveries, idle heartbeats and
  flow control requests to the deliver subject, and hears the flow control replies on
  `$JS.FC.>` (each bridge all of them, no queue group: it takes those it asked for). The
  consumer's worker may receive on its deliver subject (in its `deliver_group`, if it has one)
  and reply to flow control under `$JS.FC.<channel>.<consumer>.>`.

Why a worker gets its own inboxes and not `_INBOX.>` (which NATS' docs suggest for plain
request/reply): the bridge answers every worker's requests and delivers every pull to
inboxes, so `_INBOX.>` would let any worker read every other consumer's jobs. nats-py makes a
push subscription's deliver subject with `new_inbox()`, which carries the connection's inbox
prefix: `js.subscribe(...)` and the ordered consumer's re-creations deliver to
`_INBOX.<channel>.<consumer>.<random>`, already the worker's. A push consumer created with
another deliver subject (by an operator, or a client without the prefix) is granted by name:
the bridge may publish to it and its worker receive on it, as of the command's run.

Why `_INBOX.<user>` and not `_INBOX_<user>`: permissions match whole subject tokens, so with the
user in a token of its own the bridge's publish permission stays `_INBOX.>` whatever the
consumers are, while each worker still reads nothing but its own inboxes. The default
`_INBOX.>` for everyone would let any worker read every delivery.

Passwords are never invented here: each is a `$VARIABLE` reference that nats-server resolves
from its environment (a missing one stops it from loading the file), or a value the caller
passes in.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

JS_ACK_PREFIX = "$JS.ACK"
# The domain and account-hash tokens of the bridge's ack subjects: no domain, and the job id
# where an account's hash would be (app/bridge/protocol.AckToken).
ACK_UNSET_TOKENS = "_.*"
ADVISORY_PREFIX = "$JS.EVENT.ADVISORY.CONSUMER"
# Where push consumers' flow control replies go: `$JS.FC.<stream>.<consumer>.<id>`, as
# nats-server names them (app/bridge/push.py).
FLOW_CONTROL_PREFIX = "$JS.FC"
INBOX_ROOT = "_INBOX"
BRIDGE_PASSWORD_VARIABLE = "NATS_BRIDGE_PASSWORD"
DEFAULT_BRIDGE_USER = "webhook-broker-bridge"
DEFAULT_ACCOUNT = "WEBHOOK_BROKER"

# What a channel or consumer id must be to appear as one token of a subject, and to be written
# in nats-server's configuration without escapes: printable ASCII without the subject
# separators and wildcards, quotes or backslashes.
_TOKEN = re.compile(r"[!#-)+-\-/-=?-\[\]-~]+")
_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class BridgeSubjects:
    """The subjects of one bridge deployment, as [nats] configures them."""

    api_prefix: str
    # Where acks arrive: [nats] ack-prefix in client mode, $JS.ACK in hybrid mode.
    ack_prefix: str
    queue_group: str


@dataclass(frozen=True, slots=True)
class NatsUser:
    user: str
    # A nats-server configuration value: `$VARIABLE`, or a literal (quoted when rendered).
    password: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    comment: str = ""


class WorkerConsumer(NamedTuple):
    """A consumer a worker's user is made for; a push consumer's deliver subject and group."""

    channel_id: str
    consumer_id: str
    deliver_subject: str = ""
    deliver_group: str = ""


@dataclass(frozen=True, slots=True)
class Skipped:
    channel_id: str
    consumer_id: str
    reason: str


def is_subject_token(name: str) -> bool:
    return bool(_TOKEN.fullmatch(name))


def worker_user(channel_id: str, consumer_id: str) -> str:
    return f"{channel_id}.{consumer_id}"


def inbox_prefix(user: str) -> str:
    """The inbox prefix a worker's client must use (nats-py's `inbox_prefix`)."""
    return f"{INBOX_ROOT}.{user}"


def _variable_part(text: str) -> str:
    return re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_") or "X"


def password_variables(consumers: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """`WORKER_<CHANNEL>_<CONSUMER>_PASSWORD` per consumer; ids that fold to the same name
    (case, punctuation) get a short hash of the exact ids as well, so no two share one."""
    keys = list(dict.fromkeys(consumers))
    base = {key: f"{_variable_part(key[0])}_{_variable_part(key[1])}" for key in keys}
    counts = Counter(base.values())
    names: dict[tuple[str, str], str] = {}
    for key in keys:
        stem = base[key]
        if counts[stem] > 1:
            digest = hashlib.sha256(f"{key[0]}\x00{key[1]}".encode()).hexdigest()[:8].upper()
            stem = f"{stem}_{digest}"
        names[key] = f"WORKER_{stem}_PASSWORD"
    return names


def bridge_subscriptions(subjects: BridgeSubjects) -> tuple[str, ...]:
    """Every subject the bridge subscribes to (app/bridge/bridge.py). Consumer management
    (CREATE, DURABLE.CREATE, DELETE) is answered by the bridge alone; who may send those
    requests is whoever an operator grants them to (`management_subjects`)."""
    api = subjects.api_prefix
    return (
        f"{api}.INFO",
        f"{api}.STREAM.NAMES",
        f"{api}.STREAM.LIST",
        f"{api}.STREAM.INFO.*",
        f"{api}.CONSUMER.INFO.*.*",
        f"{api}.CONSUMER.NAMES.*",
        f"{api}.CONSUMER.LIST.*",
        *management_subjects(subjects),
        f"{api}.CONSUMER.UNPIN.*.*",
        f"{api}.CONSUMER.MSG.NEXT.*.*",
        f"{subjects.ack_prefix}.>",
        f"{FLOW_CONTROL_PREFIX}.>",
    )


def management_subjects(subjects: BridgeSubjects, channel_id: str = "*") -> tuple[str, ...]:
    """The requests that create, update and delete consumers (of one channel, or of any): a
    user granted these may manage consumers over NATS while [nats] allow-consumer-management
    is on; no worker user is granted them."""
    api = subjects.api_prefix
    # `CREATE.<channel>.>` needs a token after the channel: an unnamed ephemeral's request
    # (`CREATE.<channel>`) has none, so it is granted by name.
    creates = (
        (f"{api}.CONSUMER.CREATE.{channel_id}", f"{api}.CONSUMER.CREATE.{channel_id}.>")
        if channel_id != "*"
        else (f"{api}.CONSUMER.CREATE.>",)
    )
    return (
        *creates,
        f"{api}.CONSUMER.DURABLE.CREATE.{channel_id}.*",
        f"{api}.CONSUMER.DELETE.{channel_id}.*",
        f"{api}.CONSUMER.PAUSE.{channel_id}.*",
    )


def _in_inboxes(subject: str) -> bool:
    return subject.startswith(f"{INBOX_ROOT}.")


def bridge_permissions(
    subjects: BridgeSubjects, user: str, password: str, deliver_subjects: Iterable[str] = ()
) -> NatsUser:
    queue = subjects.queue_group
    # A leafnode's imports are checked without the queue, so the hybrid link's acks
    # ($JS.ACK, which a client connection never uses) go unqualified; every bridge hears
    # every flow control reply, outside any queue group.
    unqualified = (f"{JS_ACK_PREFIX}.>", f"{FLOW_CONTROL_PREFIX}.>")

    def allowed(subject: str) -> str:
        # `<subject> <queue>`: the bridge's client connection may subscribe only within its
        # queue group.
        return f"{subject} {queue}" if queue and subject not in unqualified else subject

    subscribe = tuple(allowed(subject) for subject in bridge_subscriptions(subjects))
    # Push consumers delivering outside the inboxes, by name.
    delivers = sorted({s for s in deliver_subjects if s and not _in_inboxes(s)})
    return NatsUser(
        user=user,
        password=password,
        publish=(f"{INBOX_ROOT}.>", f"{ADVISORY_PREFIX}.>", *delivers),
        subscribe=subscribe,
        comment="the bridge (and the broker's other processes, for advisories): password "
        f"${BRIDGE_PASSWORD_VARIABLE}",
    )


def worker_permissions(
    subjects: BridgeSubjects,
    channel_id: str,
    consumer_id: str,
    password: str,
    variable: str = "",
    *,
    deliver_subject: str = "",
    deliver_group: str = "",
) -> NatsUser:
    api = subjects.api_prefix
    user = worker_user(channel_id, consumer_id)
    own_inboxes = f"{inbox_prefix(user)}.>"
    delivers: tuple[str, ...] = ()
    if deliver_subject and not deliver_subject.startswith(f"{inbox_prefix(user)}."):
        # A deliver group's members subscribe in it: granted in that queue group only.
        delivers = (f"{deliver_subject} {deliver_group}" if deliver_group else deliver_subject,)
    return NatsUser(
        user=user,
        password=password,
        publish=(
            f"{api}.CONSUMER.MSG.NEXT.{channel_id}.{consumer_id}",
            f"{api}.CONSUMER.INFO.{channel_id}.{consumer_id}",
            f"{api}.CONSUMER.UNPIN.{channel_id}.{consumer_id}",
            f"{api}.STREAM.INFO.{channel_id}",
            # Acks of the subjects the bridge writes (`<prefix>._.<job>.<channel>.<consumer>...`,
            # app/bridge/protocol.ack_subject), and of the older form without the two tokens
            # for deliveries made before an upgrade.
            f"{subjects.ack_prefix}.{ACK_UNSET_TOKENS}.{channel_id}.{consumer_id}.>",
            f"{subjects.ack_prefix}.{channel_id}.{consumer_id}.>",
            # Flow control replies of its push consumer (nats-py answers them itself).
            f"{FLOW_CONTROL_PREFIX}.{channel_id}.{consumer_id}.>",
        ),
        subscribe=(
            own_inboxes,
            f"{ADVISORY_PREFIX}.*.{channel_id}.{consumer_id}",
            *delivers,
        ),
        comment=f"pull consumer {consumer_id} of channel {channel_id}: inbox prefix "
        f"{inbox_prefix(user)}" + (f", password ${variable}" if variable else ""),
    )


def build_users(
    subjects: BridgeSubjects,
    consumers: Sequence[tuple[str, ...]],
    *,
    bridge_user: str,
    passwords: Mapping[str, str] | None = None,
) -> tuple[list[NatsUser], list[Skipped]]:
    """The bridge's user, then one user per consumer whose ids can be subjects; each item a
    (channel, consumer) pair or a WorkerConsumer (a push consumer's deliver subject and group).

    `passwords`: values by variable name; None writes `$VARIABLE` references instead. A
    variable missing from it raises KeyError with the variable's name.
    """

    def password(variable: str) -> str:
        return f"${variable}" if passwords is None else passwords[variable]

    if not bridge_user or any(ch in bridge_user for ch in '"\\\n\r\t'):
        raise ValueError(f"bridge user {bridge_user!r} cannot be written in a nats-server config")
    skipped: list[Skipped] = []
    eligible: list[WorkerConsumer] = []
    for item in consumers:
        consumer = WorkerConsumer(*item)
        channel_id, consumer_id = consumer.channel_id, consumer.consumer_id
        if not (is_subject_token(channel_id) and is_subject_token(consumer_id)):
            skipped.append(
                Skipped(
                    channel_id,
                    consumer_id,
                    "its ids are not NATS subject tokens (printable ASCII without spaces, "
                    "'.', '*', '>', quotes or backslashes): no NATS client can reach it",
                )
            )
            continue
        if worker_user(channel_id, consumer_id) == bridge_user:
            raise ValueError(f"bridge user {bridge_user!r} is also a worker's user name")
        eligible.append(consumer)
    users = [
        bridge_permissions(
            subjects,
            bridge_user,
            password(BRIDGE_PASSWORD_VARIABLE),
            (c.deliver_subject for c in eligible),
        )
    ]
    variables = password_variables((c.channel_id, c.consumer_id) for c in eligible)
    for c in eligible:
        variable = variables[(c.channel_id, c.consumer_id)]
        users.append(
            worker_permissions(
                subjects,
                c.channel_id,
                c.consumer_id,
                password(variable),
                variable,
                deliver_subject=c.deliver_subject,
                deliver_group=c.deliver_group,
            )
        )
    return users, skipped


def _value(password: str) -> str:
    if password.startswith("$") and _NAME.fullmatch(password[1:]):
        return password  # resolved by nats-server from its variables or environment
    return json.dumps(password)


def _allow(kind: str, items: Sequence[str], indent: str) -> list[str]:
    inner = indent + "    "
    listed = [f"{inner}{json.dumps(item)}," for item in items]
    listed[-1] = listed[-1].rstrip(",")
    return [f"{indent}{kind}: {{", f"{indent}  allow: [", *listed, f"{indent}  ]", f"{indent}}}"]


def _user_lines(users: Sequence[NatsUser], indent: str) -> list[str]:
    lines: list[str] = []
    for user in users:
        if user.comment:
            lines.append(f"{indent}# {user.comment}")
        lines += [
            f"{indent}{{",
            f"{indent}  user: {json.dumps(user.user)}",
            f"{indent}  password: {_value(user.password)}",
            f"{indent}  permissions: {{",
            *_allow("publish", user.publish, indent + "    "),
            *_allow("subscribe", user.subscribe, indent + "    "),
            f"{indent}  }}",
            f"{indent}}}",
        ]
    return lines


def _skipped_lines(skipped: Sequence[Skipped]) -> list[str]:
    return [
        f"# skipped consumer {json.dumps(item.consumer_id)} of channel "
        f"{json.dumps(item.channel_id)}: {item.reason}"
        for item in skipped
    ]


def render_authorization(users: Sequence[NatsUser], skipped: Sequence[Skipped] = ()) -> str:
    """A top-level `authorization { users = [...] }` block (the global account)."""
    lines = [*_skipped_lines(skipped), "authorization {", "  users = ["]
    lines += _user_lines(users, "    ")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def render_accounts(
    users: Sequence[NatsUser], skipped: Sequence[Skipped] = (), account: str = DEFAULT_ACCOUNT
) -> str:
    """An `accounts { <account> { users = [...] } }` block: the broker's users in an account of
    their own, apart from whatever else the server carries."""
    if not _NAME.fullmatch(account):
        raise ValueError(f"account name {account!r}: letters, digits, '_' and '-' only")
    lines = [*_skipped_lines(skipped), "accounts {", f"  {account} {{", "    users = ["]
    lines += _user_lines(users, "      ")
    lines += ["    ]", "  }", "}"]
    return "\n".join(lines) + "\n"
