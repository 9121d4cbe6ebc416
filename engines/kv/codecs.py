"""Former module of the hot-path codecs, kept as an alias: see :mod:`localstate.core.codecs`."""

from localstate.core.codecs import FAST_ERRORS, fast_codec

__all__ = ["fast_codec", "FAST_ERRORS"]
