"""The one exception a learner sees: a single line naming the problem and the fix."""


class DistkitError(Exception):
    """Bad input or an unusable environment.

    The message is one line: what is wrong, then what to do about it. The CLI prints it
    as ``distkit: error: <message>`` and exits non-zero, without a traceback.
    """
