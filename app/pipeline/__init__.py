"""The Spark data pipeline: archive finished work to Parquet, prune it, report delivery analytics.

It reads `[pipeline]` and `[rdbms]` from the broker's config and talks to PostgreSQL with plain SQL
(psycopg on the driver, JDBC on the executors). It never imports app.api, app.store,
app.services or app.bridge, so it runs unchanged under spark-submit.
"""
