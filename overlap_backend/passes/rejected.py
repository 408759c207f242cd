"""Why a pass leaves a match alone."""


class Rejected(Exception):
    """Raised by a pass's ``check`` (and the helpers it calls) with the reason a match is left alone;
    the reason goes into the match's report."""
