"""Errors the exporter reports to its user (bad checkpoint, bad option), as opposed to bugs."""


class ExportError(Exception):
    """A problem with the checkpoint or the options; the CLI prints it without a traceback."""
