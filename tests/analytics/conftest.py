"""Fixtures of the Spark tests: ONE local SparkSession for the whole run (it takes ~6 s and ~0.7 GB
to start), and a sync psycopg connection."""
from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest


@pytest.fixture(scope="session")
def spark(dsn) -> Iterator:
    from fluxpg.analytics.jdbc import AnalyticsError, spark_session

    try:
        cm = spark_session(master="local[2]", app_name="fluxpg-tests")
        session = cm.__enter__()
    except AnalyticsError as exc:  # no pyspark, Java or JDBC driver here: fail loudly, never skip
        pytest.fail(f"cannot start Spark for the analytics tests: {exc}")
    yield session.spark
    cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def target(dsn):
    from fluxpg.analytics.jdbc import jdbc_target

    return jdbc_target(dsn)


@pytest.fixture
def pg(dsn) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
