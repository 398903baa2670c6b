"""Evaluation logic: functions that compute and return data (no click, no plots, no files, no bars).

OOD detection, calibration, accuracy, robustness, distal adversarials, generation, sample quality.
"""
