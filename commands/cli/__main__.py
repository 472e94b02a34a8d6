"""``python -m commands.cli``: the same entry point as the ``evidence`` script."""

from .main import main

main()
