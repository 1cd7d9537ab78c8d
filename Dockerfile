# One image for every process: `webhook-broker serve` by default; override the command for
# `api`, `sweeper`, `dispatcher`, `bridge` or `migrate` (deploy/compose.yaml runs each). Configure
# with a mounted /etc/webhook-broker/webhook-broker.cfg and/or WEBHOOK_BROKER__<SECTION>__<KEY>
# variables. `--target pipeline` adds a JRE and Debian's PostgreSQL JDBC driver for
# `webhook-broker pipeline ...` (Spark in local mode).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY clients/python ./clients/python
RUN pip wheel --no-deps --wheel-dir /wheels ./clients/python .

FROM python:3.11-slim AS broker
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels
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
COPY --from=build /wheels /wheels
RUN pip install "$(ls /wheels/webhook_broker-*.whl)[pipeline]" && rm -rf /wheels
USER broker
CMD ["pipeline", "--help"]
