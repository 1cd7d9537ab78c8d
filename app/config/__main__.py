"""`python -m app.config > webhook-broker.cfg.template`: print the template."""

from app.config.template import render_template

print(render_template(), end="")
