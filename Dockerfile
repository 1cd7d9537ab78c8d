# One image for every process: `webhook-broker serve` by default; override the command for
# `api`, `sweeper`, `dispatcher`, `bridge` or `migrate` (deploy/compose.yaml runs each). Configure
# with a mounted /etc/webhook-broker/webhook-broker.cfg and/or WEBHOOK_BROKER__<SECTION>__<KEY>
# variables. `--target pipeline` adds a JRE and Debian's PostgreSQL JDBC driver for
# `webhook-broker pipeline ...` (Spark in local mode).
# Dependencies come from the lock files (pinned, with hashes: scripts/lock writes them), so two
# builds of one commit install the same packages; the repository's own two packages are built
# here and installed on top without dependencies of their own choosing.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE alembic.ini ./
COPY app ./app
COPY clients/python ./clients/python
RUN pip wheel --no-deps --wheel-dir /wheels ./clients/python .

FROM python:3.11-slim AS broker
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements.lock /tmp/requirements.lock
RUN pip install --require-hashes -r /tmp/requirements.lock && rm /tmp/requirements.lock
COPY --from=build /wheels /wheels
# `pip check`: the lock holds everything the two wheels require, at versions they accept.
RUN pip install --no-deps /wheels/*.whl && pip check && rm -rf /wheels
RUN useradd --system --home /var/lib/webhook-broker --create-home broker
USER broker
WORKDIR /var/lib/webhook-broker
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/_status').status == 200 else 1)"
ENTRYPOINT ["webhook-broker"]
CMD ["serve"]

FROM broker AS pipeline
USER root
RUN apt-get update && apt-get install -y --no-install-recommends default-jre-headless libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/*
COPY requirements-pipeline.lock /tmp/requirements-pipeline.lock
RUN pip install --require-hashes -r /tmp/requirements-pipeline.lock && pip check \
    && rm /tmp/requirements-pipeline.lock
USER broker
CMD ["pipeline", "--help"]
