"""The user errors every layer can raise: each is printed as one line (exit code 2), never as a
traceback. A module of its own, importing nothing, so that data/, train/ and config.py can all
raise them without importing each other."""


class ConfigError(ValueError):
    """A user error in the config: reported as one line, never as a traceback."""
