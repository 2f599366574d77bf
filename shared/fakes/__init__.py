"""Doubles of the hardware and sample records, for tests, benches and the evaluation.

Never imported by a service (tests/unit/test_layout.py holds that).
"""
