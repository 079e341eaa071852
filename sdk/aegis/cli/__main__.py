"""``python -m aegis.cli``: the aegis command."""

from aegis.cli import main

main()
