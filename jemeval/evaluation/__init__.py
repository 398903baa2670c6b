"""Evaluation logic (no click): OOD detection, calibration, accuracy, robustness, generation."""
