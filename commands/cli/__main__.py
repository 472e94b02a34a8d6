"""``python -m commands.cli``: the same entry point as the ``evidence`` script."""

from .main import main

if __name__ == "__main__":  # not when a child process (verify --jobs) imports it again
    main()
