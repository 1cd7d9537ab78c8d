"""webhook-broker.cfg.template, generated from SECTIONS (`python -m app.config`)."""

from __future__ import annotations

import textwrap

from app.config.keys import IGNORED_SECTIONS, SECTIONS

TEMPLATE_HEADER = """\
# webhook-broker configuration. Every key is shown with its built-in default.
#
# Files are read in this order, later ones overriding earlier ones key by key:
#   /etc/webhook-broker/webhook-broker.cfg, ~/.webhook-broker/webhook-broker.cfg,
#   ./webhook-broker.cfg, then the file given with --config.
# Then environment variables override single keys, for containers:
#   WEBHOOK_BROKER__<SECTION>__<KEY>, underscores standing for dashes, e.g.
#   WEBHOOK_BROKER__RDBMS__CONNECTION_URL=postgresql://broker:secret@db:5432/broker
# A bad value stops the broker at start with the section, key and reason.
# Keys shown commented out are the Go original's that have no effect here: set to any valid
# value they are accepted, and the start logs them as unused. The one exception: a Go [prune]
# message-retention-days that prunes must agree with [pipeline] retention-days.
# Generated from app/config.py: python -m app.config > webhook-broker.cfg.template
"""

NOT_IMPLEMENTED_NOTE = "Unused here: any valid value is accepted and logged as unused."

TEMPLATE_FOOTER = """\
# Seeds, applied on every start (created or updated, never deleted). Uncomment to use.
# [initial-channels]
# sample-channel=Sample Channel
# [initial-producers]
# sample-producer=Sample Producer
# [initial-channel-tokens]
# sample-channel=sample-channel-token
# [initial-producer-tokens]
# sample-producer=sample-producer-token
# [initial-consumers]
# id=callback URL (may be empty for a pull consumer)
# sample-consumer=http://sample-endpoint/webhook-receiver
# sample-puller=
# One section per seeded consumer: token and channel are required; type is push
# (default) or pull; ack-wait (seconds), max-ack-pending and name are optional, and so are a
# pull consumer's priority-groups (one group), priority-policy (overflow, pinned_client,
# prioritized) and priority-timeout (seconds, pinned_client).
# [sample-consumer]
# token=sample-consumer-token
# channel=sample-channel
# [sample-puller]
# token=sample-puller-token
# channel=sample-channel
# type=pull
"""


def _comment(text: str) -> list[str]:
    wrapped = textwrap.wrap(text, width=98, break_long_words=False, break_on_hyphens=False)
    return [f"# {line}" for line in wrapped]


def render_template() -> str:
    """The commented config template; tests check the committed file equals it."""
    lines = [TEMPLATE_HEADER]
    for section in SECTIONS:
        lines.append(f"[{section.name}]")
        if section.help:
            # A bare "#" line keeps the section's prose apart from its first key's help.
            lines += [*_comment(section.help), "#"]
        for key in section.keys:
            if key.implemented:
                lines += [*_comment(key.help), f"{key.name}={key.default}"]
            else:
                lines += [*_comment(f"{key.help} {NOT_IMPLEMENTED_NOTE}")]
                lines.append(f"# {key.name}={key.default}")
        lines.append("")
    for name, (why, _defaults) in sorted(IGNORED_SECTIONS.items()):
        lines += _comment(
            f"The Go original's [{name}] section: its keys are accepted and logged as unused; "
            f"{why}."
        )
    lines += ["", TEMPLATE_FOOTER]
    return "\n".join(lines)
