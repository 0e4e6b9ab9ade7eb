"""The ``polymem`` command line (typer). Holds no logic: parse, call the library, render, exit."""
