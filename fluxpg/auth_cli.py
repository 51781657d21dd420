"""`fluxpg passwd`: make a password hash for the config's `auth.users[].password_hash` or the
`fluxpg.users` table (mounted at the top level of the `fluxpg` CLI)."""
from __future__ import annotations

import sys

import typer

from fluxpg.auth import hash_password

app = typer.Typer(help="Authentication helpers.", no_args_is_help=True, add_completion=False)


@app.command("passwd")
def passwd(
    stdin: bool = typer.Option(False, "--stdin", help="Read the password from the first line of standard input "
                               "(for scripts) instead of prompting."),
) -> None:
    """Print an scrypt hash of a password (`scrypt$n$r$p$salt$hash`) for `password_hash` in the
    config or the fluxpg.users table. The password itself is never printed or stored."""
    if stdin:
        line = sys.stdin.readline()
        password = line.rstrip("\r\n")
    else:
        try:
            password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
        except typer.Abort:
            raise typer.Exit(1) from None
    if not password:
        typer.echo("error: the password must not be empty", err=True)
        raise typer.Exit(2)
    typer.echo(hash_password(password))


if __name__ == "__main__":  # pragma: no cover
    app()
