"""The one error of the generic tiny build (``lad_lab.testing._tiny_generic``).

A module of its own: the build's steps (``lad_lab.testing._tiny_generic_processor``) raise it and
the entry imports those steps, so it cannot live in the entry.
"""

from __future__ import annotations


class TinyBuildError(ValueError):
    """This model type has no tiny build; the message names why."""
