"""The error of the wire contract's decoders."""


class WireError(ValueError):
    """A malformed value on the wire; the message names the field and the problem."""
