"""Alembic environment for fluxpg.

The connection comes from `fluxpg.db.alembic_config()` (config.attributes["connection"]) or the
`sqlalchemy.url` option; the version table lives in the fluxpg schema so that fluxpg touches
nothing outside it.
"""
from alembic import context
from sqlalchemy import create_engine, pool, text

config = context.config
VERSION_SCHEMA = "fluxpg"


def _run(connection) -> None:
    # The version table sits in our schema; it has to exist before Alembic looks for it.
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {VERSION_SCHEMA}"))
    context.configure(connection=connection, target_metadata=None,
                      version_table_schema=VERSION_SCHEMA, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
    with engine.begin() as conn:
        _run(conn)


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True,
                      version_table_schema=VERSION_SCHEMA)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
