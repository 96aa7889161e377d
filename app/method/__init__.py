"""The method's math on arrays (DESIGN §2.3–§2.5, §2.8–§2.10): calibration, debiasing, the
baselines, the refresh guard, the tournament, answer parsing.

numpy and the standard library only (and the wire's method names, ``lad_client.vocabulary``):
no torch, no model, no I/O, so the evaluation, the service and the tests share one copy of
every equation, and ``tests/unit/test_architecture.py`` keeps it that way.
"""
