"""`webhook-broker nats-permissions`: the nats-server users of a bridge deployment, from the
pull consumers in the database (app/domain/nats_permissions.py says who may do what)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from app.config import Config
from app.domain import nats_permissions as perms

COMMAND = "nats-permissions"

DESCRIPTION = f"""\
Print a nats-server configuration block with one user for the bridge and one per pull
consumer in the database, each allowed exactly its subjects. By default an
`authorization {{ users = [...] }}` block (the global account); with --accounts an
`accounts {{ <account> {{ users = [...] }} }}` block. Include it in nats-server's configuration
(`include nats-permissions.conf`) and reload nats-server whenever consumers are added or
removed.

Users: the bridge's ([nats] user, else {perms.DEFAULT_BRIDGE_USER}) may subscribe to the
JetStream API subjects (consumer management included) and the acks, in its queue group, and
publish to inboxes and consumer advisories; the hybrid leafnode link logs in as the same user.
A pull consumer's user is named <channel>.<consumer>: it may request only that consumer's
MSG.NEXT, CONSUMER.INFO and UNPIN, its channel's STREAM.INFO and acks under the consumer's
ack prefix, and read only the inboxes _INBOX.<channel>.<consumer>.> (its client must set that
inbox prefix) and its consumer's advisories; of a push consumer (deliver_subject), also its
deliver subject (in its deliver group) and its flow control replies,
$JS.FC.<channel>.<consumer>.> (the bridge hears those on $JS.FC.> and may publish to deliver
subjects outside _INBOX.>).
Consumers whose ids cannot be NATS subject tokens are listed in comments and get no user.

Passwords are not invented: each is written as a reference, ${perms.BRIDGE_PASSWORD_VARIABLE}
for the bridge and $WORKER_<CHANNEL>_<CONSUMER>_PASSWORD per consumer (shown in each user's
comment), which nats-server resolves from its environment and refuses to start without.
With --passwords-from-env the values are taken from this command's environment instead.
"""


def add_nats_permissions_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        COMMAND,
        help="print nats-server users and permissions for the bridge and each pull consumer",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument(
        "--accounts",
        action="store_true",
        help="print an accounts { ... } block (the users in an account of their own) instead "
        "of an authorization { users = [...] } block",
    )
    parser.add_argument(
        "--account",
        default=perms.DEFAULT_ACCOUNT,
        help=f"the account's name with --accounts (default {perms.DEFAULT_ACCOUNT})",
    )
    parser.add_argument(
        "--bridge-user",
        help=f"the bridge's user name (default: [nats] user, else {perms.DEFAULT_BRIDGE_USER})",
    )
    parser.add_argument(
        "--passwords-from-env",
        action="store_true",
        help="write the passwords themselves, read from this command's environment "
        f"({perms.BRIDGE_PASSWORD_VARIABLE}, WORKER_..._PASSWORD), instead of references",
    )


def bridge_subjects(config: Config) -> perms.BridgeSubjects:
    nats = config.nats
    # Hybrid mode delivers over the leafnode link with JetStream's own ack subjects.
    ack_prefix = perms.JS_ACK_PREFIX if nats.mode == "hybrid" else nats.ack_prefix
    return perms.BridgeSubjects(nats.api_prefix, ack_prefix, nats.queue_group)


def permissions_text(
    config: Config,
    consumers: Sequence[tuple[str, ...]],
    *,
    accounts: bool = False,
    account: str = perms.DEFAULT_ACCOUNT,
    bridge_user: str | None = None,
    passwords: dict[str, str] | None = None,
) -> tuple[str, list[perms.Skipped]]:
    """What the command prints for these consumers (deploy/nats-permissions.conf is this for
    none). Raises KeyError (a password variable not in `passwords`) or ValueError."""
    subjects = bridge_subjects(config)
    users, skipped = perms.build_users(
        subjects,
        consumers,
        bridge_user=bridge_user or config.nats.user or perms.DEFAULT_BRIDGE_USER,
        passwords=passwords,
    )
    header = (
        f"# webhook-broker {COMMAND}: mode={config.nats.mode}, api={subjects.api_prefix}, "
        f"acks={subjects.ack_prefix}, {len(users) - 1} pull consumer(s)\n"
    )
    if accounts:
        return header + perms.render_accounts(users, skipped, account), skipped
    return header + perms.render_authorization(users, skipped), skipped


async def run_nats_permissions(config: Config, args: argparse.Namespace) -> int:
    from app.services.nats_permissions import pull_consumers
    from app.store.db import Database

    db = Database.from_config(config.database)
    try:
        consumers = await pull_consumers(db)
    finally:
        await db.dispose()
    try:
        text, skipped = permissions_text(
            config,
            consumers,
            accounts=args.accounts,
            account=args.account,
            bridge_user=args.bridge_user,
            passwords=dict(os.environ) if args.passwords_from_env else None,
        )
    except KeyError as exc:
        print(f"webhook-broker: {COMMAND}: {exc.args[0]} is not set", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"webhook-broker: {COMMAND}: {exc}", file=sys.stderr)
        return 1
    for item in skipped:
        print(
            f"webhook-broker: {COMMAND}: no user for consumer {item.consumer_id!r} of channel "
            f"{item.channel_id!r}: {item.reason}",
            file=sys.stderr,
        )
    sys.stdout.write(text)
    return 0
