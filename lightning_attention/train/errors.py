"""Errors of the main job that the command line reports as one line, without a traceback."""


class UserError(Exception):
    """A problem with the options, the data, a dependency or a checkpoint that the user can fix: the message says
    what is wrong and what to do. ``lightning-attention`` prints it as ``error: <message>`` and exits with status 2."""
