"""Adversarial robustness: ``evaluate.py`` (robust), ``attack_loop.py`` (attack, re-check, count),
``checks.py`` (the adaptive-defence checklist), ``threat.py`` (norms, epsilon balls), ``intervals.py``
(Wilson intervals). 0.2's modules ``jemeval.evaluation.robustness``, ``attack_loop``,
``robust_checks``, ``threat`` and ``intervals`` are aliases of these for one release.
"""
