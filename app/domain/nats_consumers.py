"""Consumer management over NATS, free of I/O: a CONSUMER.CREATE request read as nats-server
2.15 reads it (server/jetstream_api.go jsConsumerCreateRequest, server/consumer.go
setConsumerConfigDefaults, checkConsumerCfg and checkNewConsumerConfig), its settings mapped
onto a broker pull consumer, and the settings the broker cannot honour refused by name.

Every failure is a `ConsumerApiError`: nats-server's code, error code and text where nats-server
refuses the request itself, or a 400 without an error code naming the setting the broker does
not support (those refusals are the only place a later feature has to change).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from app.domain.models import MAX_FIELD_LENGTH, Consumer
from app.domain.priority import (
    PriorityConfigError,
    PriorityPolicy,
    PrioritySettings,
    parse_policy,
    priority_settings,
)

NANOS = 1_000_000_000
# nats-server's defaults (server/consumer.go) for what a request leaves unset.
DEFAULT_ACK_WAIT = 30 * NANOS
DEFAULT_MAX_ACK_PENDING = 1000
DEFAULT_MAX_WAITING = 512  # JSWaitQueueDefaultMax
DEFAULT_PINNED_TTL = 120 * NANOS
# JsDeleteWaitTimeDefault: an ephemeral consumer without an inactive threshold gets this one.
DEFAULT_EPHEMERAL_THRESHOLD = 5 * NANOS
MAX_DESCRIPTION = 4 * 1024  # JSMaxDescriptionLen
MAX_METADATA = 128 * 1024  # JSMaxMetadataLen
MAX_INTEGER = 2**31 - 1  # the consumer's INTEGER columns
# The metadata keys nats-server writes itself (server/jetstream_versioning.go).
REQUIRED_LEVEL_KEY = "_nats.req.level"
SERVER_VERSION_KEY = "_nats.ver"
SERVER_LEVEL_KEY = "_nats.level"
DYNAMIC_PREFIX = "_nats."

DELIVER_POLICIES = (
    "all",
    "last",
    "new",
    "by_start_sequence",
    "by_start_time",
    "last_per_subject",
)
# Every policy: `new` fans out from creation on, the others copy the channel's stored messages
# from their start first (app/bridge/backfill.py). A channel has one subject, so
# last_per_subject is `last`.
SUPPORTED_DELIVER_POLICIES = DELIVER_POLICIES
# AckNone: a job is DELIVERED as it is sent. AckAll would settle a job's predecessors too,
# which the broker's per-job acks do not.
SUPPORTED_ACK_POLICIES = ("explicit", "none")
ACK_POLICIES = ("none", "all", "explicit", "flow_control")
REPLAY_POLICIES = ("instant", "original")
ACTIONS = {"": "create_or_update", "create": "create", "update": "update"}


class ConsumerApiError(Exception):
    """A JetStream API error: `err_code` None for the bridge's own refusals."""

    def __init__(self, code: int, err_code: int | None, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.err_code = err_code
        self.description = description


def jetstream_error(code: int, err_code: int, description: str) -> ConsumerApiError:
    return ConsumerApiError(code, err_code, description)


def unsupported(setting: str, why: str) -> ConsumerApiError:
    """A setting the broker cannot honour: refused by name, never dropped."""
    return ConsumerApiError(400, None, f"webhook-broker does not support {setting}: {why}")


def create_error(text: str) -> ConsumerApiError:
    """NewJSConsumerCreateError of a plain error: how nats-server answers a refused update."""
    return ConsumerApiError(500, 10012, text)


# -- reading the request as Go does ----------------------------------------------------------

# Field -> Go type of ConsumerConfig (server/consumer.go).
_CONFIG_FIELDS: dict[str, str] = {
    "durable_name": "string",
    "name": "string",
    "description": "string",
    "deliver_policy": "DeliverPolicy",
    "opt_start_seq": "uint64",
    "opt_start_time": "time.Time",
    "ack_policy": "AckPolicy",
    "ack_wait": "time.Duration",
    "max_deliver": "int",
    "backoff": "[]time.Duration",
    "filter_subject": "string",
    "filter_subjects": "[]string",
    "replay_policy": "ReplayPolicy",
    "rate_limit_bps": "uint64",
    "sample_freq": "string",
    "max_waiting": "int",
    "max_ack_pending": "int",
    "flow_control": "bool",
    "headers_only": "bool",
    "max_batch": "int",
    "max_expires": "time.Duration",
    "max_bytes": "int",
    "deliver_subject": "string",
    "deliver_group": "string",
    "idle_heartbeat": "time.Duration",
    "inactive_threshold": "time.Duration",
    "num_replicas": "int",
    "mem_storage": "bool",
    "direct": "bool",
    "sourcing": "bool",
    "metadata": "map[string]string",
    "pause_until": "time.Time",
    "priority_groups": "[]string",
    "priority_policy": "PriorityPolicy",
    "priority_timeout": "time.Duration",
}
_ENUMS: dict[str, tuple[str, ...]] = {
    "DeliverPolicy": DELIVER_POLICIES,
    "AckPolicy": ACK_POLICIES,
    "ReplayPolicy": REPLAY_POLICIES,
    "PriorityPolicy": ("none", "overflow", "pinned_client", "prioritized"),
}
_INTEGER_TYPES = ("int", "uint64", "time.Duration")


def go_json_kind(value: object) -> str:
    """How encoding/json names a decoded value's kind in its unmarshal type errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def invalid_json(text: str) -> ConsumerApiError:
    return jetstream_error(400, 10025, f"invalid JSON: {text}")


GO_MAX_DEPTH = 10_000  # encoding/json's maxNestingDepth


def go_depth_error(body: bytes) -> str:
    """What json.Decoder says of a document nested past Python's recursion limit: Go's own
    text, with its offset in bytes where Go's limit is passed too (Python gives up sooner, at
    about a thousand levels, where Go reads on; the request is refused either way)."""
    depth = 0
    in_string = escaped = False
    # Byte by byte: no byte of a multi-byte UTF-8 sequence is one of these ASCII characters.
    for index, byte in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > GO_MAX_DEPTH:
                return f"exceeded max depth at offset {index + 1}"
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return "exceeded max depth"


def _go_json_text(body: bytes) -> str:
    # Go keeps invalid UTF-8 inside strings as U+FFFD instead of refusing the document.
    return body.decode("utf-8", "replace").strip()


def is_json_object_or_array(body: bytes) -> bool:
    """Whether nats-server reads an optional request body at all (isJSONObjectOrArray)."""
    return _go_json_text(body).startswith(("{", "["))


def decode_go_json(body: bytes) -> Any:
    """A JetStream API request's JSON document; ConsumerApiError 10025 when it is none."""
    text = _go_json_text(body)
    if not text:
        raise invalid_json("unexpected end of JSON input")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise invalid_json(str(exc)) from None
    except RecursionError:
        raise invalid_json(go_depth_error(body)) from None


def _type_error(value: object, where: str, go_type: str) -> ConsumerApiError:
    kind = go_json_kind(value)
    if kind == "number":
        kind = f"number {json.dumps(value)}"
    return invalid_json(
        f"json: cannot unmarshal {kind} into Go struct field CreateConsumerRequest.{where} "
        f"of type {go_type}"
    )


def _checked(name: str, value: object) -> object:
    go_type = _CONFIG_FIELDS[name]
    where = f"config.{name}"
    if value is None:
        return None
    if go_type in _ENUMS:
        if not isinstance(value, str) or value not in _ENUMS[go_type]:
            raise invalid_json(f"can not unmarshal {json.dumps(json.dumps(value))}")
        return value
    if go_type == "string":
        if not isinstance(value, str):
            raise _type_error(value, where, go_type)
        return value
    if go_type == "bool":
        if not isinstance(value, bool):
            raise _type_error(value, where, go_type)
        return value
    if go_type in _INTEGER_TYPES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(value, where, go_type)
        if not -(2**63) <= value < 2**64 or (go_type != "uint64" and value >= 2**63):
            raise _type_error(value, where, go_type)
        if go_type == "uint64" and value < 0:
            raise _type_error(value, where, go_type)
        return value
    if go_type == "time.Time":
        if not isinstance(value, str):
            raise _type_error(value, where, go_type)
        return value
    if go_type.startswith("[]"):
        if not isinstance(value, list):
            raise _type_error(value, where, go_type)
        inner = go_type[2:]
        for item in value:
            ok = isinstance(item, str) if inner == "string" else _integer(item)
            if not ok:
                raise _type_error(item, where, inner)
        return list(value)
    # map[string]string
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _type_error(value, where, go_type)
    return dict(value)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


@dataclass(frozen=True, slots=True)
class CreateRequest:
    stream_name: str
    config: dict[str, Any]
    action: str
    pedantic: bool


def parse_create_request(body: bytes) -> CreateRequest:
    """The request body as nats-server unmarshals it; ConsumerApiError 10025 when it cannot."""
    raw = decode_go_json(body)
    if not isinstance(raw, dict):
        raise invalid_json(f"json: cannot unmarshal {go_json_kind(raw)} into Go value")
    stream = raw.get("stream_name")
    if stream is not None and not isinstance(stream, str):
        raise invalid_json(
            f"json: cannot unmarshal {go_json_kind(stream)} into Go struct field "
            "CreateConsumerRequest.stream_name of type string"
        )
    action = raw.get("action") or ""
    if not isinstance(action, str) or action not in ACTIONS:
        raise invalid_json(f"unknown consumer action: {action}")
    pedantic = raw.get("pedantic") or False
    if not isinstance(pedantic, bool):
        raise _type_error(pedantic, "pedantic", "bool")
    given = raw.get("config")
    if given is not None and not isinstance(given, dict):
        raise invalid_json(
            f"json: cannot unmarshal {go_json_kind(given)} into Go struct field "
            "CreateConsumerRequest.config of type server.ConsumerConfig"
        )
    config: dict[str, Any] = {}
    for key, value in (given or {}).items():
        name = key if key in _CONFIG_FIELDS else _folded(key)
        if name is not None:
            # A checked value is at most a list or a map of strings: shallow.
            config[name] = _go_strings(_checked(name, value))
    return CreateRequest(_go_strings(stream or ""), config, ACTIONS[action], pedantic)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _go_strings(value: Any) -> Any:
    """Strings as Go decodes them: a `\\uXXXX` escape of half a surrogate pair is U+FFFD
    (Python keeps it, and it cannot be encoded, measured or stored)."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_go_strings(item) for item in value]
    if isinstance(value, dict):
        return {_go_strings(k): _go_strings(v) for k, v in value.items()}
    return value


def _folded(key: str) -> str | None:
    """Go matches JSON keys to fields case-insensitively."""
    lower = key.lower()
    return next((f for f in _CONFIG_FIELDS if f == lower), None)


# -- the consumer's settings ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """A pull consumer's JetStream config, defaults applied, in nats-server's units (ns).
    Compared whole to tell an unchanged CREATE from an update."""

    name: str
    description: str = ""
    deliver_policy: str = "all"
    ack_policy: str = "explicit"
    replay_policy: str = "instant"
    deliver_subject: str = ""
    ack_wait: int = DEFAULT_ACK_WAIT
    max_deliver: int = -1
    backoff: tuple[int, ...] = ()
    max_waiting: int = DEFAULT_MAX_WAITING
    max_ack_pending: int = DEFAULT_MAX_ACK_PENDING
    metadata: tuple[tuple[str, str], ...] = ()  # without nats-server's own keys
    priority: PrioritySettings = field(default_factory=PrioritySettings)
    durable: bool = True
    inactive_threshold: int = 0  # ns, 0: never deleted for inactivity
    # A push consumer (deliver_subject set): its queue group, heartbeat (ns) and flow control.
    deliver_group: str = ""
    idle_heartbeat: int = 0
    flow_control: bool = False
    # A history deliver policy's start: the stream sequence (message pk) or the time (UTC,
    # microseconds: the database keeps no finer); mem_storage as asked.
    opt_start_seq: int = 0
    opt_start_time: datetime | None = None
    mem_storage: bool = False

    def metadata_dict(self) -> dict[str, str] | None:
        return dict(self.metadata) or None


@dataclass(frozen=True, slots=True)
class ProcessLimits:
    """What a bridge process applies to every consumer (the [pull] keys), reported in each
    consumer's config, so a request may name them but not set others."""

    max_waiting: int
    max_batch: int
    max_expires: int  # ns
    default_ack_wait: int  # seconds, for consumers made over HTTP without one
    max_retry: int


def _nonzero(config: Mapping[str, Any], name: str) -> bool:
    value = config.get(name)
    return value not in (None, 0, "", False, [], {})


def resolve_name(config: Mapping[str, Any]) -> str:
    return str(config.get("durable_name") or config.get("name") or "")


def check_config(config: Mapping[str, Any]) -> ConsumerSpec:
    """nats-server's defaults and checks, in its order (the broker's refusals come after the
    update checks: `refuse_unsupported`)."""
    name = resolve_name(config)
    for key, label in (("name", "consumer name"), ("durable_name", "consumer durable name")):
        value = config.get(key) or ""
        if value and any(ch in value for ch in " \t\r\n\f.*>\\/"):
            raise jetstream_error(500, 10052, f"{label} can not contain '.', '*', '>', '\\', '/'")
    replicas = int(config.get("num_replicas") or 0)
    if replicas < 0:
        raise jetstream_error(400, 10133, "replicas count cannot be negative")
    if replicas > 1:
        raise jetstream_error(400, 10126, "consumer config replica count exceeds parent stream")
    ack_policy = config.get("ack_policy") or "none"
    deliver_subject = config.get("deliver_subject") or ""
    backoff = [int(v) for v in config.get("backoff") or []]
    if any(v < 0 for v in backoff):
        raise jetstream_error(400, 10184, "consumer backoff needs to be positive")
    ack_wait = int(config.get("ack_wait") or 0)
    if ack_wait < 0:
        raise jetstream_error(400, 10183, "consumer ack wait needs to be positive")
    max_deliver = int(config.get("max_deliver") or 0)
    if max_deliver == 0 or max_deliver < -1:
        max_deliver = -1
    if backoff and max_deliver != -1 and len(backoff) > max_deliver:
        raise jetstream_error(
            400, 10116, "max deliver is required to be > length of backoff values"
        )
    description = str(config.get("description") or "")
    if len(description.encode()) > MAX_DESCRIPTION:
        raise jetstream_error(
            400, 10107, f"consumer description is too long, maximum allowed is {MAX_DESCRIPTION}"
        )
    max_waiting = int(config.get("max_waiting") or 0)
    is_durable = bool(config.get("durable_name"))
    inactive_threshold = requested_threshold(config)
    if not is_durable and inactive_threshold == 0:
        # updateInactiveThreshold: ephemerals always expire, and the config shows it.
        inactive_threshold = DEFAULT_EPHEMERAL_THRESHOLD
    idle_heartbeat = max(int(config.get("idle_heartbeat") or 0), 0)
    if deliver_subject:
        _check_push(config, deliver_subject, ack_policy, max_waiting, idle_heartbeat)
    if not deliver_subject:
        if _nonzero(config, "rate_limit_bps"):
            raise jetstream_error(400, 10086, "consumer in pull mode can not have rate limit set")
        if max_waiting < 0:
            max_waiting = 0  # setConsumerConfigDefaults, before the check can see it
        if _nonzero(config, "idle_heartbeat") and int(config["idle_heartbeat"]) > 0:
            raise jetstream_error(
                400, 10088, "consumer idle heartbeat requires a push based consumer"
            )
        if config.get("flow_control"):
            raise jetstream_error(
                400, 10089, "consumer flow control requires a push based consumer"
            )
        expires = int(config.get("max_expires") or 0)
        if 0 < expires < 1_000_000:
            raise jetstream_error(400, 10115, "consumer max request expires needs to be >= 1ms")
    if config.get("direct") and not deliver_subject:
        raise jetstream_error(400, 10090, "consumer direct requires a push based consumer")
    filter_subject = str(config.get("filter_subject") or "")
    filters = list(config.get("filter_subjects") or [])
    if filter_subject and filters:
        raise jetstream_error(
            400, 10136, "consumer cannot have both FilterSubject and FilterSubjects specified"
        )
    if any(f == "" for f in filters):
        raise jetstream_error(400, 10139, "consumer filter in FilterSubjects cannot be empty")
    deliver_policy = config.get("deliver_policy") or "all"
    _check_start(deliver_policy, config, filter_subject or bool(filters))
    durable, named = config.get("durable_name"), config.get("name")
    if durable and named and durable != named:
        raise jetstream_error(
            400, 10132, "Consumer Durable and Name have to be equal if both are provided"
        )
    if config.get("flow_control") and idle_heartbeat == 0:
        raise jetstream_error(400, 10108, "consumer with flow control also needs heartbeats")
    metadata = {
        k: v for k, v in (config.get("metadata") or {}).items() if not k.startswith(DYNAMIC_PREFIX)
    }
    # Counted in UTF-8 bytes, as Go's len() counts a string.
    if sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items()) > MAX_METADATA:
        raise jetstream_error(400, 10135, "consumer metadata exceeds maximum size of 128KB")
    priority = _priority(config)

    if ack_wait == 0 and ack_policy in ("explicit", "all"):
        ack_wait = DEFAULT_ACK_WAIT
    if backoff:
        ack_wait = backoff[0]
    if ack_policy == "none" and not backoff and not _nonzero(config, "ack_wait"):
        ack_wait = 0  # nats-server sets no ack wait for a consumer that takes no acks
    max_ack_pending = int(config.get("max_ack_pending") or 0)
    if max_ack_pending < -1:
        max_ack_pending = -1
    if max_ack_pending == 0 and ack_policy != "none":
        max_ack_pending = DEFAULT_MAX_ACK_PENDING
    if max_waiting == 0 and not deliver_subject:
        max_waiting = DEFAULT_MAX_WAITING
    return ConsumerSpec(
        name=name,
        description=description,
        deliver_policy=deliver_policy,
        ack_policy=ack_policy,
        replay_policy=config.get("replay_policy") or "instant",
        deliver_subject=deliver_subject,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        backoff=tuple(backoff),
        max_waiting=max_waiting,
        max_ack_pending=max_ack_pending,
        metadata=tuple(sorted(metadata.items())),
        priority=priority,
        durable=is_durable,
        inactive_threshold=inactive_threshold,
        deliver_group=str(config.get("deliver_group") or "") if deliver_subject else "",
        idle_heartbeat=idle_heartbeat,
        flow_control=bool(config.get("flow_control")),
        opt_start_seq=int(config.get("opt_start_seq") or 0),
        opt_start_time=_start_time(config.get("opt_start_time")),
        mem_storage=bool(config.get("mem_storage")),
    )


# RFC 3339 as Go's time.Time unmarshals it, with up to nine fraction digits.
_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)


def go_iso_time(text: str) -> str | None:
    """An RFC 3339 time as datetime.fromisoformat reads it, sub-microsecond digits dropped
    (Python keeps six); None when Go would not parse it. The date and clock are checked only
    by fromisoformat."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    day, clock, fraction, zone = match.groups()
    micros = (fraction or "").ljust(6, "0")[:6]
    offset = "+00:00" if zone in ("Z", "z") else zone
    return f"{day}T{clock}.{micros}{offset}"


def _start_time(value: object) -> datetime | None:
    """opt_start_time as a UTC datetime (sub-microsecond digits dropped); 10025 as Go's
    json.Unmarshal refuses a time it cannot parse."""
    if value is None:
        return None
    text = str(value)
    iso = go_iso_time(text)
    if iso is None:
        quoted = json.dumps(json.dumps(text))
        raise invalid_json(f'parsing time {quoted} as "\\"2006-01-02T15:04:05Z07:00\\""')
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError as exc:
        raise invalid_json(f'parsing time "{json.dumps(text)}": {exc}') from None
    return parsed.astimezone(UTC)


def _check_push(
    config: Mapping[str, Any],
    deliver_subject: str,
    ack_policy: str,
    max_waiting: int,
    idle_heartbeat: int,
) -> None:
    """checkConsumerCfg's push-mode checks, in its order (the cycle through the stream's own
    subject is checked by `refuse_unsupported`, which knows the stream)."""
    tokens = deliver_subject.split(".")
    if any(t in ("*", ">") for t in tokens):
        raise jetstream_error(400, 10079, "consumer deliver subject has wildcards")
    if any(not t or any(ch in t for ch in " \t\r\n") for t in tokens):
        raise jetstream_error(400, 10112, "invalid push consumer deliver subject")
    if max_waiting != 0:
        raise jetstream_error(400, 10080, "consumer in push mode can not set max waiting")
    if int(config.get("max_ack_pending") or 0) > 0 and ack_policy == "none":
        raise jetstream_error(400, 10082, "consumer requires ack policy for max ack pending")
    if 0 < idle_heartbeat < NANOS // 10:
        raise jetstream_error(400, 10083, "consumer idle heartbeat needs to be >= 100ms")


def refuse_unsupported(
    spec: ConsumerSpec, config: Mapping[str, Any], stream: str, limits: ProcessLimits
) -> None:
    """What the broker cannot do (yet), refused by name: a later feature removes its refusal."""
    name = spec.name
    deliver_subject = spec.deliver_subject
    ack_policy = spec.ack_policy
    filter_subject = str(config.get("filter_subject") or "")
    filters = list(config.get("filter_subjects") or [])
    if len(name) > MAX_FIELD_LENGTH or "\x00" in name:
        raise jetstream_error(
            400, 10102, f"consumer name is too long, maximum allowed is {MAX_FIELD_LENGTH}"
        )
    if deliver_subject and subject_matches(stream, deliver_subject):
        raise jetstream_error(400, 10081, "consumer deliver subject forms a cycle")
    if deliver_subject and _nonzero(config, "rate_limit_bps"):
        raise unsupported("rate_limit_bps", "a push consumer is delivered as fast as it acks")
    if config.get("deliver_group") and not deliver_subject:
        raise unsupported("deliver_group", "it is a push consumer setting")
    if ack_policy not in SUPPORTED_ACK_POLICIES:
        raise unsupported(
            f"ack_policy {ack_policy}",
            "a broker consumer acknowledges each job (explicit) or none (none)",
        )
    if spec.replay_policy != "instant":
        raise unsupported("replay_policy original", "jobs are delivered as soon as they are due")
    for setting in (
        "sample_freq",
        "headers_only",
        "max_bytes",
        "sourcing",
    ):
        if _nonzero(config, setting):
            raise unsupported(setting, _WHY[setting])
    for subject in [filter_subject, *filters]:
        if subject and not subject_matches(subject, stream):
            raise unsupported(
                f"filter_subject {subject}",
                f"a consumer gets every message of its channel (subject {stream})",
            )
    if len(filters) > 1:
        raise unsupported("several filter_subjects", "a channel has one subject")
    for setting, allowed in (
        ("max_batch", limits.max_batch),
        ("max_expires", limits.max_expires),
    ):
        if _nonzero(config, setting) and int(config[setting]) != allowed:
            raise unsupported(
                f"{setting} {config[setting]}",
                f"every consumer has this bridge's limit ({allowed}, set by [pull])",
            )
    waits = [("ack_wait", spec.ack_wait)] if spec.ack_wait or ack_policy != "none" else []
    for setting, nanos in (*waits, *(("backoff", v) for v in spec.backoff)):
        if nanos % NANOS or not NANOS <= nanos <= MAX_INTEGER * NANOS:
            raise unsupported(
                f"{setting} of {nanos} ns", "ack waits are whole seconds, at least 1 s"
            )
    for setting, value in (
        ("max_deliver", spec.max_deliver),
        ("max_ack_pending", spec.max_ack_pending),
        ("max_waiting", spec.max_waiting),
    ):
        if value > MAX_INTEGER:
            raise unsupported(f"{setting} {value}", f"at most {MAX_INTEGER}")


_WHY = {
    "sample_freq": "the bridge sends no ack sampling advisories",
    "headers_only": "jobs are delivered with their payload",
    "max_bytes": "the bridge limits a request's bytes only as the request asks",
    "sourcing": "it is for stream sourcing",
}


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a trailing `>` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or token not in ("*", have[index]):
            return False
    return len(want) == len(have)


def _check_start(policy: str, config: Mapping[str, Any], filtered: object) -> None:
    seq = bool(config.get("opt_start_seq"))
    at = config.get("opt_start_time") is not None
    words = {
        "all": "all",
        "last": "last",
        "last_per_subject": "last per subject",
        "new": "new",
        "by_start_sequence": "by start sequence",
        "by_start_time": "by start time",
    }[policy]

    def bad_start(start: str) -> ConsumerApiError:
        return jetstream_error(
            400,
            10094,
            f"consumer delivery policy is deliver {words}, but optional start {start} is also set",
        )

    def not_set(what: str) -> ConsumerApiError:
        return jetstream_error(
            400,
            10094,
            f"consumer delivery policy is deliver {words}, but optional {what} is not set",
        )

    if policy in ("all", "last", "last_per_subject", "new"):
        if seq:
            raise bad_start("sequence")
        if at:
            raise bad_start("time")
        if policy == "last_per_subject" and not filtered:
            raise not_set("filter subject")
    elif policy == "by_start_sequence":
        if not seq:
            raise not_set("start sequence")
        if at:
            raise bad_start("time")
    elif policy == "by_start_time":
        if not at:
            raise not_set("start time")
        if seq:
            raise bad_start("start sequence")


def _priority(config: Mapping[str, Any]) -> PrioritySettings:
    policy = config.get("priority_policy") or "none"
    groups = list(config.get("priority_groups") or [])
    timeout = int(config.get("priority_timeout") or 0)
    if timeout < 0:
        timeout = 0
    if policy == "none":
        if groups:
            raise jetstream_error(
                400, 10196, "consumer can not have priority groups when policy is none"
            )
        if timeout > 0:
            raise jetstream_error(400, 10197, "PinnedTTL cannot be set when PriorityPolicy is none")
        return PrioritySettings()
    if policy == "pinned_client" and timeout == 0:
        timeout = DEFAULT_PINNED_TTL
    if timeout % NANOS:
        raise unsupported(f"priority_timeout of {timeout} ns", "pin timeouts are whole seconds")
    seconds = timeout // NANOS if policy == "pinned_client" else None
    try:
        return priority_settings(groups, parse_policy(policy), seconds, pull=True)
    except PriorityConfigError as exc:
        raise ConsumerApiError(400, exc.err_code, exc.description) from None


def spec_of(consumer: Consumer, limits: ProcessLimits) -> ConsumerSpec:
    """The JetStream config a broker consumer has, as CONSUMER.INFO reports it."""
    options = consumer.options
    priority = consumer.priority
    if priority.active and priority.policy is PriorityPolicy.PINNED_CLIENT:
        priority = replace(priority, timeout_seconds=priority.timeout())
    ack_none = options.ack_policy == "none"
    return ConsumerSpec(
        name=consumer.id,
        description=options.description or "",
        deliver_policy=options.deliver_policy or "all",
        ack_policy=options.ack_policy or "explicit",
        ack_wait=0
        if ack_none and not consumer.ack_wait_seconds
        else consumer.ack_wait(limits.default_ack_wait) * NANOS,
        max_deliver=options.max_deliver
        if options.max_deliver is not None
        else limits.max_retry + 1,
        backoff=tuple(v * NANOS for v in options.backoff),
        max_waiting=0 if options.deliver_subject else options.max_waiting or limits.max_waiting,
        max_ack_pending=consumer.max_ack_pending or (0 if ack_none else -1),
        metadata=tuple(sorted((options.metadata or {}).items())),
        priority=priority if priority.active else PrioritySettings(),
        durable=not options.ephemeral,
        inactive_threshold=options.inactive_threshold or 0,
        deliver_subject=options.deliver_subject or "",
        deliver_group=options.deliver_group or "",
        idle_heartbeat=options.idle_heartbeat or 0,
        flow_control=options.flow_control,
        # The column keeps every history policy's first message pk (app/store/backfill.py).
        opt_start_seq=(options.opt_start_seq or 0)
        if options.deliver_policy == "by_start_sequence"
        else 0,
        opt_start_time=options.opt_start_time,
        mem_storage=options.mem_storage,
    )


def requested_threshold(config: Mapping[str, Any]) -> int:
    """The inactive threshold a request sets itself (setConsumerConfigDefaults: a negative one
    is none), before an ephemeral's default is stamped on it."""
    return max(int(config.get("inactive_threshold") or 0), 0)


def update_threshold(current: ConsumerSpec, config: Mapping[str, Any]) -> int:
    """An existing consumer's inactive threshold after an update, as updateInactiveThreshold
    sets it: only a consumer that already expires gets the ephemeral default; one that never
    expired (a durable) never starts to because the request leaves out durable_name."""
    given = requested_threshold(config)
    if given == current.inactive_threshold:
        return given
    if not current.durable and given == 0:
        return DEFAULT_EPHEMERAL_THRESHOLD
    return given


def check_update(current: ConsumerSpec, wanted: ConsumerSpec) -> None:
    """checkNewConsumerConfig: what an existing consumer may not change (500 10012)."""
    if current.deliver_policy != wanted.deliver_policy:
        raise create_error("deliver policy can not be updated")
    if current.opt_start_seq != wanted.opt_start_seq:
        raise create_error("start sequence can not be updated")
    if current.opt_start_time != wanted.opt_start_time:
        raise create_error("start time can not be updated")
    if current.ack_policy != wanted.ack_policy:
        raise create_error("ack policy can not be updated")
    if current.replay_policy != wanted.replay_policy:
        raise create_error("replay policy can not be updated")
    if current.idle_heartbeat != wanted.idle_heartbeat:
        raise create_error("heart beats can not be updated")
    if current.flow_control != wanted.flow_control:
        raise create_error("flow control can not be updated")
    if current.deliver_subject != wanted.deliver_subject:
        if not current.deliver_subject:
            raise create_error("can not update pull consumer to push based")
        if not wanted.deliver_subject:
            raise create_error("can not update push consumer to pull based")
    if current.max_waiting != wanted.max_waiting:
        raise create_error("max waiting can not be updated")


def column_values(spec: ConsumerSpec) -> dict[str, Any]:
    """The consumer columns a spec sets (the HTTP API's own columns keep their meaning)."""
    return {
        "ack_wait_seconds": spec.ack_wait // NANOS or None,
        "max_ack_pending": spec.max_ack_pending if spec.max_ack_pending > 0 else None,
        "max_deliver": spec.max_deliver,
        "max_waiting": spec.max_waiting,
        "backoff": [v // NANOS for v in spec.backoff] or None,
        "description": spec.description or None,
        "metadata": spec.metadata_dict(),
        "deliver_policy": spec.deliver_policy,
        "priority_group": spec.priority.group,
        "priority_policy": spec.priority.policy.value,
        "priority_timeout_seconds": spec.priority.timeout_seconds,
        "ephemeral": not spec.durable,
        "ack_policy": None if spec.ack_policy == "explicit" else spec.ack_policy,
        "inactive_threshold": spec.inactive_threshold or None,
        "deliver_subject": spec.deliver_subject or None,
        "deliver_group": spec.deliver_group or None,
        "idle_heartbeat": spec.idle_heartbeat or None,
        "flow_control": spec.flow_control,
        "opt_start_seq": spec.opt_start_seq or None,
        "opt_start_time": spec.opt_start_time,
        "mem_storage": spec.mem_storage,
    }


# The deliver policies whose consumer starts by copying the channel's stored messages.
HISTORY_POLICIES = ("all", "last", "last_per_subject", "by_start_sequence", "by_start_time")


def delivers_history(spec: ConsumerSpec) -> bool:
    return spec.deliver_policy in HISTORY_POLICIES


def required_level(spec: ConsumerSpec) -> int:
    """setStaticConsumerMetadata: 1 for a consumer with priority groups, else 0."""
    return 1 if spec.priority.active else 0


def backoff_lease(backoff: tuple[int, ...], attempt: int) -> int | None:
    """Seconds delivery `attempt` (1-based) may stay unacknowledged under a backoff, as
    nats-server's checkPending times it: backoff[attempt - 1], the last one after that."""
    if not backoff or attempt < 1:
        return None
    return backoff[min(attempt - 1, len(backoff) - 1)]
