"""Attacks behind jemeval's attack interface (jemeval.interfaces). Filled by the robustness work."""
from __future__ import annotations

#: name -> attack factory, registered by jemeval.builtins.attacks
BUILTIN_ATTACKS: dict = {}
