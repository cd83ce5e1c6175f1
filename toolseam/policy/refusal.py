"""The one exception a policy above the seam raises to refuse a call."""


class Refusal(Exception):
    """A policy refused the call; the message is the one line the model reads."""
