# One image for every process: `webhook-broker serve` by default; override the command for
# `api`, `sweeper`, `dispatcher`, `bridge` or `migrate`. Configure with a mounted
# /etc/webhook-broker/webhook-broker.cfg and/or WEBHOOK_BROKER__<SECTION>__<KEY> variables.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY migrations ./migrations
RUN pip install . && rm -rf /src

RUN useradd --system --home /var/lib/webhook-broker --create-home broker
USER broker
WORKDIR /var/lib/webhook-broker

EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/_status').status == 200 else 1)"
ENTRYPOINT ["webhook-broker"]
CMD ["serve"]
