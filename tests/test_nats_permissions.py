"""app/domain/nats_permissions.py: the users `webhook-broker nats-permissions` writes, checked as
text and by a real nats-server (`nats-server -t`); the deployment itself is tested in
tests/security/test_nats_permissions.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from app.domain import nats_permissions as perms
from tests.helpers.natsproc import nats_server_binary

SUBJECTS = perms.BridgeSubjects("$JS.API", "$WB.ACK", "webhook-broker-bridge")


def nats_server_accepts(
    text: str, root: Path, **environment: str
) -> subprocess.CompletedProcess[str]:
    conf = root / "nats.conf"
    conf.write_text(text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "NATS_"))}
    return subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)],
        env={**clean, **environment},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_each_worker_gets_its_consumer_subjects_only() -> None:
    users, skipped = perms.build_users(
        SUBJECTS, [("orders", "billing"), ("orders", "audit")], bridge_user="bridge"
    )
    assert skipped == []
    bridge, billing, audit = users
    assert (
        billing.user == "orders.billing" and billing.password == "$WORKER_ORDERS_BILLING_PASSWORD"
    )
    assert billing.publish == (
        "$JS.API.CONSUMER.MSG.NEXT.orders.billing",
        "$JS.API.CONSUMER.INFO.orders.billing",
        "$JS.API.CONSUMER.UNPIN.orders.billing",
        "$JS.API.STREAM.INFO.orders",
        "$WB.ACK._.*.orders.billing.>",
        "$WB.ACK.orders.billing.>",
        "$JS.FC.orders.billing.>",
    )
    assert billing.subscribe == (
        "_INBOX.orders.billing.>",
        "$JS.EVENT.ADVISORY.CONSUMER.*.orders.billing",
    )
    # Only their channel's STREAM.INFO is common to two consumers of one channel.
    assert set(billing.publish) & set(audit.publish) == {"$JS.API.STREAM.INFO.orders"}
    # Consumer management is the bridge's alone.
    assert "$JS.API.CONSUMER.DELETE.*.* webhook-broker-bridge" in bridge.subscribe
    assert "$JS.API.CONSUMER.CREATE.> webhook-broker-bridge" in bridge.subscribe
    assert not any("CREATE" in s or "DELETE" in s for u in (billing, audit) for s in u.publish)
    assert bridge.password == "$NATS_BRIDGE_PASSWORD"
    # Every bridge hears every flow control reply (it takes those it asked for): no queue.
    assert "$JS.FC.>" in bridge.subscribe
    assert bridge.publish == ("_INBOX.>", "$JS.EVENT.ADVISORY.CONSUMER.>")


def test_a_push_consumers_worker_receives_on_its_deliver_subject() -> None:
    users, _ = perms.build_users(
        SUBJECTS,
        [
            perms.WorkerConsumer("orders", "grouped", "push.orders", "grp"),
            perms.WorkerConsumer("orders", "alone", "push.alone"),
            # nats-py's js.subscribe with the worker's inbox prefix: already its own.
            perms.WorkerConsumer("orders", "inboxed", "_INBOX.orders.inboxed.Xy12"),
            # Another inbox (a client without the prefix): granted by name.
            perms.WorkerConsumer("orders", "stray", "_INBOX.Qz9"),
            ("orders", "pulling"),
        ],
        bridge_user="bridge",
    )
    bridge, grouped, alone, inboxed, stray, pulling = users
    # Only within its deliver group, as its members subscribe.
    assert grouped.subscribe[2:] == ("push.orders grp",)
    assert alone.subscribe[2:] == ("push.alone",)
    assert inboxed.subscribe[2:] == () and pulling.subscribe[2:] == ()
    assert stray.subscribe[2:] == ("_INBOX.Qz9",)
    # The bridge delivers to the subjects outside the inboxes it may already publish to.
    assert bridge.publish == (
        "_INBOX.>",
        "$JS.EVENT.ADVISORY.CONSUMER.>",
        "push.alone",
        "push.orders",
    )
    # Flow control replies only for its own consumer.
    assert [s for s in grouped.publish if s.startswith("$JS.FC")] == ["$JS.FC.orders.grouped.>"]


def test_a_channels_management_subjects_cover_the_unnamed_ephemeral() -> None:
    # CREATE.<channel>.> needs a token after the channel; an unnamed ephemeral's request
    # (nats.js ordered consumers, jsm.consumers.add without a name) has none.
    granted = perms.management_subjects(SUBJECTS, "orders")
    for subject in (
        "$JS.API.CONSUMER.CREATE.orders",
        "$JS.API.CONSUMER.CREATE.orders.c1.orders",
        "$JS.API.CONSUMER.DURABLE.CREATE.orders.c1",
        "$JS.API.CONSUMER.DELETE.orders.c1",
    ):
        assert any(_matches(g, subject) for g in granted), subject
    assert not any(_matches(g, "$JS.API.CONSUMER.CREATE.other") for g in granted)


def _matches(pattern: str, subject: str) -> bool:
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or token not in ("*", have[index]):
            return False
    return len(want) == len(have)


def test_ids_that_fold_together_get_distinct_password_variables() -> None:
    names = perms.password_variables([("orders", "a-b"), ("orders", "a_b"), ("Orders", "x")])
    assert len(set(names.values())) == 3
    assert names[("Orders", "x")] == "WORKER_ORDERS_X_PASSWORD"
    assert all(
        name.startswith("WORKER_ORDERS_A_B_") for key, name in names.items() if key[1] != "x"
    )


def test_ids_no_subject_can_carry_get_no_user() -> None:
    users, skipped = perms.build_users(
        SUBJECTS,
        [("orders", "a.b"), ("orders", "all>"), ("or ders", "x"), ('q"uote', "x"), ("ok", "ok")],
        bridge_user="bridge",
    )
    assert [u.user for u in users] == ["bridge", "ok.ok"]
    assert [(s.channel_id, s.consumer_id) for s in skipped][:2] == [
        ("orders", "a.b"),
        ("orders", "all>"),
    ]
    assert len(skipped) == 4
    assert "# skipped consumer" in perms.render_authorization(users, skipped)


def test_both_forms_load_in_nats_server_and_need_every_password(tmp_path: Path) -> None:
    users, _ = perms.build_users(
        SUBJECTS,
        [("orders", "billing"), perms.WorkerConsumer("orders", "pushed", "push.x", "grp")],
        bridge_user="bridge",
    )
    for text in (perms.render_authorization(users), perms.render_accounts(users)):
        loaded = nats_server_accepts(
            text,
            tmp_path,
            NATS_BRIDGE_PASSWORD="b",
            WORKER_ORDERS_BILLING_PASSWORD="w",
            WORKER_ORDERS_PUSHED_PASSWORD="p",
        )
        assert loaded.returncode == 0, loaded.stdout + loaded.stderr
        # A password missing from the environment stops the server, not an empty password.
        missing = nats_server_accepts(
            text, tmp_path, NATS_BRIDGE_PASSWORD="b", WORKER_ORDERS_PUSHED_PASSWORD="p"
        )
        assert missing.returncode != 0
        assert "WORKER_ORDERS_BILLING_PASSWORD" in missing.stdout + missing.stderr


def test_passwords_given_are_written_quoted() -> None:
    users, _ = perms.build_users(
        SUBJECTS,
        [("orders", "billing")],
        bridge_user="bridge",
        passwords={"NATS_BRIDGE_PASSWORD": "b$x", "WORKER_ORDERS_BILLING_PASSWORD": 'w"q'},
    )
    text = perms.render_authorization(users)
    assert 'password: "b$x"' in text and 'password: "w\\"q"' in text
    with pytest.raises(KeyError, match="WORKER_ORDERS_BILLING_PASSWORD"):
        perms.build_users(
            SUBJECTS,
            [("orders", "billing")],
            bridge_user="b",
            passwords={"NATS_BRIDGE_PASSWORD": "b"},
        )
