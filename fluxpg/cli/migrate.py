"""`fluxpg migrate`: upgrade or downgrade the schema; says the revision before and after and
whether functions and views were re-created.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from fluxpg.cli.app import ConfigOpt, DataDirOpt, DsnOpt, app, stdout
from fluxpg.cli.database import check_connection, database, redact_dsn
from fluxpg.cli.errors import CliError, _command


@app.command()
@_command
def migrate(
    dsn: DsnOpt = None,
    revision: Annotated[str, typer.Option("--revision", metavar="REV", help="Upgrade to this revision.")] = "head",
    downgrade: Annotated[Optional[str], typer.Option("--downgrade", metavar="REV", show_default=False,
                         help="Downgrade to this revision instead ('base' removes everything fluxpg created).")] = None,
    config_file: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Upgrade the database schema to the newest revision (or --revision / --downgrade). Idempotent."""
    from fluxpg import db

    if downgrade is not None and revision != "head":
        raise CliError("give either --revision or --downgrade, not both", 2)
    with database(dsn, config_file, data_dir, create=True) as target:
        check_connection(target)
        before = db.current_revision(target)
        recreated: list[str] = []
        if downgrade is not None:
            db.downgrade(target, downgrade)
        else:
            recreated = db.migrate(target, revision)
        after = db.current_revision(target)
    stdout.print(f"database:  {redact_dsn(target)}", markup=False, highlight=False)
    stdout.print(f"before:    {before or 'none (no fluxpg schema)'}", markup=False, highlight=False)
    stdout.print(f"after:     {after or 'none (no fluxpg schema)'}"
                 + ("  (unchanged)" if before == after else ""), markup=False, highlight=False)
    if after is not None and after == db.head_revision():
        why = {"revision": "new revision", "installed": "installed definitions differed"}
        state = ("re-created (" + ", ".join(why.get(r, f"{r} changed") for r in recreated) + ")"
                 if recreated else "current")
    else:
        state = "not installed below the head revision"
    stdout.print(f"functions and views: {state}", markup=False, highlight=False)
