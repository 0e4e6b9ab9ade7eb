"""``python -m polymem …``: the same command line as ``polymem``."""

from polymem.cli.app import main

if __name__ == "__main__":
    main()
