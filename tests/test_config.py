"""Config loading: every layer in order, environment overrides, and errors that name the key."""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path

import pytest

from app import cli
from app import config as config_module
from app.config import SECTIONS, ConfigError, Key, load_config, load_config_text, render_template
from app.config import load as config_load
from app.domain.models import ConsumerType

TEMPLATE = Path(__file__).resolve().parents[1] / "webhook-broker.cfg.template"


@pytest.fixture
def layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The four file layers in a sandbox: system file, HOME, working directory, --config."""
    system = tmp_path / "etc" / "webhook-broker.cfg"
    home = tmp_path / "home"
    cwd = tmp_path / "cwd"
    for folder in (system.parent, home / ".webhook-broker", cwd):
        folder.mkdir(parents=True)
    monkeypatch.setattr(config_load, "SYSTEM_CONFIG", system)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    return {
        "system": system,
        "home": home / ".webhook-broker" / "webhook-broker.cfg",
        "cwd": cwd / "webhook-broker.cfg",
        "explicit": tmp_path / "explicit.cfg",
    }


def test_built_in_defaults() -> None:
    cfg = load_config(search_default_locations=False, environ={})
    assert cfg.database.dialect == "sqlite"
    assert cfg.database.connection_url == "webhook-broker.sqlite3"
    assert (cfg.http.host, cfg.http.port) == ("127.0.0.1", 8080)
    assert cfg.http.admin_token == ""
    assert cfg.broker.max_retry == 5
    assert cfg.broker.retry_backoff_delays == (5, 30, 60)
    assert cfg.broker.max_message_size_bytes == 5242880
    assert cfg.log.level == "INFO"
    assert cfg.default_ack_wait_seconds == 30 + 2
    assert cfg.sources == ()
    assert cfg.seed.channels == () and cfg.seed.consumers == ()


def test_default_locations_follow_home_and_working_directory(layers: dict[str, Path]) -> None:
    assert config_module.default_locations() == (layers["system"], layers["home"], layers["cwd"])


def test_each_layer_overrides_the_one_before_key_by_key(layers: dict[str, Path]) -> None:
    # Every layer sets max-retry (the last file wins) and one key of its own (which survives).
    layers["system"].write_text("[broker]\nmax-retry=1\nmax-workers=11\n")
    layers["home"].write_text("[broker]\nmax-retry=2\nrational-delay-in-seconds=7\n")
    layers["cwd"].write_text("[broker]\nmax-retry=3\nmax-message-size-bytes=1234\n")
    layers["explicit"].write_text("[broker]\nmax-retry=4\nretry-backoff-delays-in-seconds=1,2\n")

    cfg = load_config(layers["explicit"], environ={})
    assert cfg.broker.max_retry == 4
    assert cfg.broker.max_workers == 11
    assert cfg.broker.rational_delay_seconds == 7
    assert cfg.broker.max_message_size_bytes == 1234
    assert cfg.broker.retry_backoff_delays == (1, 2)
    assert cfg.sources == tuple(str(layers[name]) for name in ("system", "home", "cwd", "explicit"))

    # Without --config the working-directory file is the last word.
    assert load_config(environ={}).broker.max_retry == 3
    layers["cwd"].unlink()
    assert load_config(environ={}).broker.max_retry == 2
    layers["home"].unlink()
    assert load_config(environ={}).broker.max_retry == 1
    layers["system"].unlink()
    assert load_config(environ={}).broker.max_retry == 5


def test_environment_overrides_every_file(layers: dict[str, Path]) -> None:
    layers["cwd"].write_text("[broker]\nmax-retry=3\n[http]\nlistener=:9000\n")
    layers["explicit"].write_text("[broker]\nmax-retry=4\n")
    environ = {
        "WEBHOOK_BROKER__BROKER__MAX_RETRY": "9",
        "WEBHOOK_BROKER__HTTP__ADMIN_TOKEN": "s3cret",
        "WEBHOOK_BROKER__RDBMS__CONNECTION_URL": "/data/broker.sqlite3",
        "UNRELATED": "ignored",
    }
    cfg = load_config(layers["explicit"], environ=environ)
    assert cfg.broker.max_retry == 9
    assert cfg.http.admin_token == "s3cret"
    assert cfg.http.port == 9000
    assert cfg.database.connection_url == "/data/broker.sqlite3"


def test_environment_is_read_from_os_environ_by_default(
    layers: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEBHOOK_BROKER__HTTP__LISTENER", "127.0.0.1:8181")
    cfg = load_config()
    assert (cfg.http.host, cfg.http.port) == ("127.0.0.1", 8181)


def test_environment_can_seed_channels() -> None:
    environ = {
        "WEBHOOK_BROKER__INITIAL_CHANNELS__orders": "Orders",
        "WEBHOOK_BROKER__INITIAL_CHANNEL_TOKENS__orders": "tok",
        # Ids are taken as written: case and underscores are kept.
        "WEBHOOK_BROKER__INITIAL_CHANNELS__Order_Events": "Events",
        "WEBHOOK_BROKER__INITIAL_CHANNEL_TOKENS__Order_Events": "tok2",
        "WEBHOOK_BROKER__INITIAL_PRODUCERS__shop_1": "Shop",
        "WEBHOOK_BROKER__INITIAL_PRODUCER_TOKENS__shop_1": "tok3",
    }
    cfg = load_config(search_default_locations=False, environ=environ)
    assert sorted((c.id, c.name, c.token) for c in cfg.seed.channels) == [
        ("Order_Events", "Events", "tok2"),
        ("orders", "Orders", "tok"),
    ]
    assert [(p.id, p.token) for p in cfg.seed.producers] == [("shop_1", "tok3")]


def test_over_long_seed_values_are_refused() -> None:
    long = "x" * 256
    with pytest.raises(ConfigError, match=r"\[initial-channels\] c1: the token"):
        load_config_text(f"[initial-channels]\nc1=\n[initial-channel-tokens]\nc1={long}\n")
    with pytest.raises(ConfigError, match=r"\[initial-consumers\] k1: the name"):
        load_config_text(
            f"[initial-consumers]\nk1=\n[k1]\ntoken=t\nchannel=c\ntype=pull\nname={long}\n"
        )


@pytest.mark.parametrize(
    "name", ["WEBHOOK_BROKER__HTTP", "WEBHOOK_BROKER__HTTP__LISTENER__X", "WEBHOOK_BROKER____X"]
)
def test_malformed_environment_variable_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        load_config(search_default_locations=False, environ={name: "1"})


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.cfg"
    with pytest.raises(ConfigError, match="nope.cfg"):
        load_config(missing, search_default_locations=False, environ={})


def test_unparsable_file_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.cfg"
    broken.write_text("max-retry=1\n")  # a key before any section
    with pytest.raises(ConfigError, match="broken.cfg"):
        load_config(broken, search_default_locations=False, environ={})
    binary = tmp_path / "binary.cfg"
    binary.write_bytes(b"[broker]\nmax-retry=\xff\xfe\n")
    with pytest.raises(ConfigError, match="binary.cfg"):
        load_config(binary, search_default_locations=False, environ={})


BAD_VALUES = [
    ("rdbms", "dialect", "oracle"),
    ("rdbms", "connection-url", ""),
    ("rdbms", "max-open-connxns", "zero"),
    ("rdbms", "max-idle-connxns", "0"),
    ("rdbms", "connxn-max-lifetime-seconds", "-1"),
    ("http", "listener", "8080"),
    ("http", "listener", ":99999"),
    ("http", "read-timeout", "soon"),
    ("log", "log-level", "loud"),
    ("log", "compress-backups", "maybe"),
    ("broker", "max-retry", "-1"),
    ("broker", "max-retry", "many"),
    ("broker", "retry-backoff-delays-in-seconds", "5,x"),
    ("broker", "retry-backoff-delays-in-seconds", ","),
    ("broker", "max-message-size-bytes", "0"),
    ("broker", "priority-dispatcher-enabled", "perhaps"),
    ("consumer-connection", "token-header-name", "X Bad"),
    ("consumer-connection", "connection-timeout-in-seconds", "1.5"),
    ("pull", "max-batch", "0"),
]


@pytest.mark.parametrize(("section", "key", "value"), BAD_VALUES)
def test_bad_value_names_section_and_key(section: str, key: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(f"[{section}]\n{key}={value}\n")
    assert f"[{section}] {key}" in str(caught.value)


@pytest.mark.parametrize(("section", "key", "value"), BAD_VALUES[:6])
def test_bad_environment_value_names_section_and_key(section: str, key: str, value: str) -> None:
    env_name = (
        f"WEBHOOK_BROKER__{section.replace('-', '_').upper()}__" + key.replace("-", "_").upper()
    )
    with pytest.raises(ConfigError) as caught:
        load_config(search_default_locations=False, environ={env_name: value})
    assert f"[{section}] {key}" in str(caught.value)


def test_unknown_key_in_a_known_section() -> None:
    with pytest.raises(ConfigError, match=r"\[broker\] max-retries: unknown key"):
        load_config_text("[broker]\nmax-retries=3\n")


def test_postgresql_url_is_checked_without_leaking_the_password() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text("[rdbms]\ndialect=postgresql\nconnection-url=mysql://u:hunter2@h/db\n")
    assert "[rdbms] connection-url" in str(caught.value)
    assert "hunter2" not in str(caught.value)
    cfg = load_config_text(
        "[rdbms]\ndialect=postgres\nconnection-url=postgres://u:pw@db:5432/broker\n"
    )
    assert cfg.database.dialect == "postgresql"
    assert cfg.database.sqlalchemy_url == "postgresql+psycopg://u:pw@db:5432/broker"


def test_sqlite_takes_a_path_not_a_url() -> None:
    with pytest.raises(ConfigError, match=r"\[rdbms\] connection-url"):
        load_config_text("[rdbms]\ndialect=sqlite3\nconnection-url=sqlite:///x.db\n")
    cfg = load_config_text("[rdbms]\ndialect=sqlite3\nconnection-url=/tmp/x.db?_foreign_keys=1\n")
    assert cfg.database.connection_url == "/tmp/x.db"


def test_listener_and_log_level_forms() -> None:
    cfg = load_config_text("[http]\nlistener=[::1]:8443\n[log]\nlog-level=warn\n")
    assert (cfg.http.host, cfg.http.port) == ("::1", 8443)
    assert cfg.log.level == "WARNING"


SEEDS = """
[initial-channels]
orders=Order events
audit=

[initial-channel-tokens]
orders=orders-token
audit=audit-token

[initial-producers]
shop=The shop

[initial-producer-tokens]
shop=shop-token

[initial-consumers]
mailer=https://mail.example/hook
warehouse=
ledger=http://ledger:8000/in

[mailer]
token=mailer-token
channel=orders

[warehouse]
token=warehouse-token
channel=orders
type=pull
ack-wait=45
max-ack-pending=10

[ledger]
token=ledger-token
channel=audit
type=PUSH
name=Ledger
"""


def test_seed_sections_are_parsed() -> None:
    seed = load_config_text(SEEDS).seed
    assert [(c.id, c.name, c.token) for c in seed.channels] == [
        ("orders", "Order events", "orders-token"),
        ("audit", "audit", "audit-token"),
    ]
    assert [(p.id, p.name, p.token) for p in seed.producers] == [("shop", "The shop", "shop-token")]
    by_id = {c.id: c for c in seed.consumers}
    assert list(by_id) == ["mailer", "warehouse", "ledger"]
    mailer, warehouse, ledger = by_id["mailer"], by_id["warehouse"], by_id["ledger"]
    # An empty type means push.
    assert (mailer.type, mailer.channel_id, mailer.token) == (
        ConsumerType.PUSH,
        "orders",
        "mailer-token",
    )
    assert mailer.callback_url == "https://mail.example/hook"
    # A pull consumer may have no callback URL.
    assert (warehouse.type, warehouse.callback_url) == (ConsumerType.PULL, "")
    assert (warehouse.ack_wait_seconds, warehouse.max_ack_pending) == (45, 10)
    assert (ledger.type, ledger.name, ledger.channel_id) == (ConsumerType.PUSH, "Ledger", "audit")


def _without(text: str, line: str) -> str:
    assert line in text
    return text.replace(line, "", 1)


BAD_SEEDS = [
    # (description, config text, words the message must contain)
    (
        "channel without token",
        _without(SEEDS, "audit=audit-token\n"),
        ["[initial-channels] audit", "initial-channel-tokens"],
    ),
    (
        "producer without token",
        _without(SEEDS, "shop=shop-token\n"),
        ["[initial-producers] shop", "initial-producer-tokens"],
    ),
    (
        "token for an unseeded channel",
        SEEDS.replace("audit=audit-token", "audit=audit-token\nghost=x"),
        ["[initial-channel-tokens] ghost"],
    ),
    (
        "consumer without its section",
        SEEDS.replace("ledger=http://ledger:8000/in", "ledger=http://ledger:8000/in\nlost="),
        ["[initial-consumers] lost"],
    ),
    (
        "relative callback URL for push",
        SEEDS.replace("mailer=https://mail.example/hook", "mailer=/hook"),
        ["[initial-consumers] mailer", "absolute"],
    ),
    (
        "callback URL without scheme",
        SEEDS.replace("mailer=https://mail.example/hook", "mailer=mail.example/hook"),
        ["[initial-consumers] mailer", "absolute"],
    ),
    (
        "push consumer without a callback URL",
        SEEDS.replace("mailer=https://mail.example/hook", "mailer="),
        ["[initial-consumers] mailer", "push"],
    ),
    (
        "consumer without token",
        _without(SEEDS, "token=mailer-token\n"),
        ["[mailer] token"],
    ),
    (
        "consumer without channel",
        _without(SEEDS, "channel=audit\n"),
        ["[ledger] channel"],
    ),
    ("unknown consumer key", SEEDS.replace("name=Ledger", "colour=red"), ["[ledger] colour"]),
    ("bad ack-wait", SEEDS.replace("ack-wait=45", "ack-wait=-3"), ["[warehouse] ack-wait"]),
]


@pytest.mark.parametrize(
    ("text", "words"), [case[1:] for case in BAD_SEEDS], ids=[case[0] for case in BAD_SEEDS]
)
def test_invalid_seed_entry_is_named(text: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text)
    for word in words:
        assert word in str(caught.value)


def test_error_messages_never_echo_seeded_tokens() -> None:
    text = SEEDS.replace("mailer=https://mail.example/hook", "mailer=/hook")
    with pytest.raises(ConfigError) as caught:
        load_config_text(text)
    for token in ("orders-token", "audit-token", "shop-token", "ledger-token"):
        assert token not in str(caught.value)


def test_a_seed_consumer_of_an_invalid_type_is_skipped_alone() -> None:
    cfg = load_config_text(SEEDS.replace("type=PUSH", "type=webhook"))
    assert "ledger" not in [c.id for c in cfg.seed.consumers]
    assert len(cfg.seed.consumers) == len(load_config_text(SEEDS).seed.consumers) - 1
    assert len(cfg.seed.skipped) == 1
    for word in ("[ledger] type='webhook'", "push or pull", "not created"):
        assert word in cfg.seed.skipped[0]
    assert "ledger-token" not in cfg.seed.skipped[0]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[broker]\nmax-retry=many\n", "[broker] max-retry='many': must be a whole number"),
        ("[broker]\nmax-retry=-1\n", "[broker] max-retry='-1': must be zero or more"),
        ("[pull]\nmax-batch=0\n", "[pull] max-batch='0': must be at least 1"),
        ("[http]\nlistener=:http\n", "[http] listener=':http': must be a whole number"),
        ("[http]\nlistener=:0\n", "[http] listener=':0': port must be between 1 and 65535"),
        ("[rdbms]\ndialect=oracle\n", "[rdbms] dialect='oracle': must be sqlite or postgresql"),
        ("[log]\ncompress-backups=maybe\n", "must be true or false"),
    ],
)
def test_bad_value_gives_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text)
    assert reason in str(caught.value)


# -- The key table: template, not-implemented keys, validation of every typed key ----------------


def test_template_is_generated_from_the_key_table() -> None:
    assert TEMPLATE.read_text(encoding="utf-8") == render_template(), (
        "webhook-broker.cfg.template is stale: python -m app.config > webhook-broker.cfg.template"
    )


# Keys of the Go original that we accept but do not act on (checked by hand against app/).
NOT_IMPLEMENTED = [
    "[log] max-file-size-in-mb",
    "[log] max-backups",
    "[log] max-age-in-days",
    "[log] compress-backups",
    "[broker] max-message-queue-size",
    "[broker] priority-dispatcher-enabled",
    "[broker] retrigger-base-endpoint",
    "[broker] recovery-workers-enabled",
    "[scheduler] scheduler-interval-ms",
    "[scheduler] scheduler-batch-size",
]


def test_not_implemented_keys_are_reported_only_when_set() -> None:
    assert load_config_text("").ignored_keys == ()
    # A copy of the template sets none of them: they are commented out there.
    assert load_config_text(TEMPLATE.read_text(encoding="utf-8")).ignored_keys == ()
    declared = [
        f"[{section.name}] {key.name}"
        for section in SECTIONS
        for key in section.keys
        if not key.implemented
    ]
    assert declared == NOT_IMPLEMENTED
    # Set to its default still counts: it was set, and it still does nothing.
    text = "".join(
        f"[{section.name}]\n{key.name}={key.default}\n"
        for section in SECTIONS
        for key in section.keys
        if not key.implemented
    )
    assert load_config_text(text).ignored_keys == tuple(NOT_IMPLEMENTED)


def test_not_implemented_keys_set_by_environment_or_ignored_section() -> None:
    cfg = load_config_text(
        "[scheduler]\nscheduler-interval-ms=5000\n[broker]\nmax-retry=3\n"
        "[prune]\nmessage-retention-days=0\n",
        environ={"WEBHOOK_BROKER__LOG__MAX_BACKUPS": "3"},
    )
    assert cfg.ignored_keys == (
        "[scheduler] scheduler-interval-ms",
        "[prune] message-retention-days",
        "[log] max-backups",
    )
    assert cfg.broker.max_retry == 3


def test_a_go_key_with_no_meaning_here_is_accepted_at_any_valid_value() -> None:
    # The Helm chart's production queue size, the integration configs' [dlq] interval, log
    # rotation and every other not-implemented key: logged as unused, never a stop.
    cfg = load_config_text(
        "[broker]\nmax-message-queue-size=1000000\npriority-dispatcher-enabled=false\n"
        "recovery-workers-enabled=false\nretrigger-base-endpoint=http://other:8082\n"
        "[log]\nmax-backups=7\ncompress-backups=false\n"
        "[dlq]\nsummary-update-interval-seconds=5\n"
        "[prune]\nexport-path=/files/export\nmax-archive-file-size-in-mb=1\n",
        environ={"WEBHOOK_BROKER__SCHEDULER__SCHEDULER_BATCH_SIZE": "7"},
    )
    assert cfg.ignored_keys == (
        "[broker] max-message-queue-size",
        "[broker] priority-dispatcher-enabled",
        "[broker] recovery-workers-enabled",
        "[broker] retrigger-base-endpoint",
        "[log] max-backups",
        "[log] compress-backups",
        "[dlq] summary-update-interval-seconds",
        "[prune] export-path",
        "[prune] max-archive-file-size-in-mb",
        "[scheduler] scheduler-batch-size",
    )


def test_go_pruning_retention_must_agree_with_the_pipeline_retention() -> None:
    pruning = "[prune]\nexport-node-name=w7b6\nmessage-retention-days=300\n"
    with pytest.raises(ConfigError) as raised:
        load_config_text(pruning)
    for word in ("[prune] message-retention-days=300", "pipeline archive", "retention-days=7"):
        assert word in str(raised.value)
    agreed = load_config_text(pruning + "[pipeline]\nretention-days=300\n")
    assert agreed.pipeline.retention_days == 300
    assert "[prune] message-retention-days" in agreed.ignored_keys
    # Go prunes only with both keys set: a retention without a node name prunes nothing.
    assert load_config_text("[prune]\nmessage-retention-days=300\n").ignored_keys == (
        "[prune] message-retention-days",
    )


@pytest.mark.parametrize(
    ("text", "environ", "words"),
    [
        ("", {"WEBHOOK_BROKER__LOG__MAX_BACKUPS": "many"}, ["[log] max-backups", "many"]),
        ("[broker]\npriority-dispatcher-enabled=perhaps\n", {}, ["priority-dispatcher-enabled"]),
        ("[prune]\nmessage-retention-days=-3\n", {}, ["[prune] message-retention-days"]),
        ("[prune]\nremote-export-destination=ftp\n", {}, ["s3 or gcs"]),
        ("[dlq]\nsummary-update-interval-seconds=soon\n", {}, ["[dlq]", "summary"]),
        ("[prune]\nretention=3\n", {}, ["[prune] retention: unknown key"]),
    ],
)
def test_an_invalid_value_of_an_unused_go_key_stops_the_start(
    text: str, environ: dict[str, str], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config_text(text, environ=environ)
    for word in words:
        assert word in str(raised.value)


def test_another_spelling_of_the_go_default_is_accepted() -> None:
    cfg = load_config_text("[broker]\npriority-dispatcher-enabled=yes\n[log]\nmax-backups=03\n")
    assert cfg.ignored_keys == ("[broker] priority-dispatcher-enabled", "[log] max-backups")


def test_start_warns_once_naming_each_not_implemented_key(
    layers: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    layers["explicit"].write_text(
        "[log]\nmax-backups=3\n[broker]\npriority-dispatcher-enabled=true\nmax-retry=2\n"
    )
    monkeypatch.setenv("WEBHOOK_BROKER__LOG__MAX_AGE_IN_DAYS", "28")
    # Only the start-up path is under test: keep caplog's handler, skip the migration.
    monkeypatch.setattr(cli, "setup_logging", lambda config: None)
    monkeypatch.setattr(cli, "migrate", lambda config: None)
    with caplog.at_level(logging.WARNING):
        assert cli.main(["--config", str(layers["explicit"]), "migrate"]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    for name in (
        "[log] max-backups",
        "[broker] priority-dispatcher-enabled",
        "[log] max-age-in-days",
    ):
        assert name in warnings[0]
    assert "max-retry" not in warnings[0]
    assert "no effect" in warnings[0]


# One invalid value per parser; a new parser needs one here before its keys are covered.
INVALID_BY_PARSER = {
    "_dialect": "oracle",
    "_log_format": "xml",
    "_optional_listener": "nohost",
    "_non_empty": "",
    "_non_negative_int": "-1",
    "_positive_int": "0",
    "_listener": "8080",
    "_log_level": "loud",
    "_boolean": "maybe",
    "_delays": ",",
    "_header_name": "X Bad",
    "_terminal_statuses": "QUEUED",
    "_nats_mode": "push",
    "_nats_url": "http://x:1",
    "_nats_prefix": "a.*.b",
    "_gateway_mode": "oauth",
    "_base64_secret": "not*base64",
    "_path_prefixes": "_status",
    "_networks": "10.0.0.0/33",
    "_postgres_url": "mysql://x/y",
    "_duration": "5 parsecs",
    "_partition_interval": "-1d",
    "_niceness": "20",
}
TYPED_KEYS = [
    (section.name, key) for section in SECTIONS for key in section.keys if key.parse is not str
]


@pytest.mark.parametrize(
    ("section", "key"), TYPED_KEYS, ids=[f"{s}.{k.name}" for s, k in TYPED_KEYS]
)
def test_every_typed_key_refuses_a_bad_value_by_name(section: str, key: Key) -> None:
    parser_name = getattr(key.parse, "__name__", repr(key.parse))
    assert parser_name in INVALID_BY_PARSER, f"give {parser_name} an invalid example"
    value = INVALID_BY_PARSER[parser_name]
    env_name = "WEBHOOK_BROKER__{}__{}".format(
        section.replace("-", "_").upper(), key.name.replace("-", "_").upper()
    )
    in_a_file: tuple[str, dict[str, str]] = (f"[{section}]\n{key.name}={value}\n", {})
    in_the_environment = ("", {env_name: value})
    for text, environ in (in_a_file, in_the_environment):
        with pytest.raises(ConfigError) as caught:
            load_config_text(text, environ=environ)
        # The key by name; its value too, unless the key holds a secret.
        named = f"[{section}] {key.name}" + (":" if key.secret else "=")
        assert named in str(caught.value)
        assert (value in str(caught.value)) is not key.secret or not value


def test_every_field_gets_a_value_of_its_declared_type() -> None:
    # The table hands parsed values to the dataclasses untyped; this checks what mypy cannot.
    cfg = load_config_text("")
    sections = (cfg.database, cfg.http, cfg.log, cfg.broker, cfg.consumer_connection)
    for part in (*sections, cfg.pull, cfg.pipeline, cfg.nats, cfg.gateway_auth):
        hints = typing.get_type_hints(type(part))
        for field in dataclasses.fields(part):
            hint = hints[field.name]
            expected = typing.get_origin(hint) or hint
            assert isinstance(getattr(part, field.name), expected), (type(part), field.name)
