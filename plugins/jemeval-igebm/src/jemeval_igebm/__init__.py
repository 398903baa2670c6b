"""jemeval-igebm: the IGEBM baseline (Du & Mordatch 2019) as a jemeval plugin.

Registers the model ``igebm`` (``jemeval train digits --arch igebm --objective factored``) and
ships a converter for the TensorFlow release's checkpoints (:mod:`jemeval_igebm.convert_tf`,
needs the ``tf`` extra). TensorFlow is imported only by that converter.
"""
from __future__ import annotations

__version__ = "0.1.0"
