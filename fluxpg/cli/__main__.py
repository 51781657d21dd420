"""`python -m fluxpg.cli`: the `fluxpg` command (workers of `fluxpg serve --workers N` start so)."""
from fluxpg.cli import main


main()
