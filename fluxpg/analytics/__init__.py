"""PySpark jobs that read the fluxpg log over JDBC (`fluxpg analytics …`).

Modules: jdbc (DSN → JDBC URL, driver discovery, session builder, seq-range planning), report,
export, sql, follow, render (Rich tables, charts) and cli (the Typer app). Nothing here imports
pyspark at import time of cli.py; the jobs import it when they run.
"""
