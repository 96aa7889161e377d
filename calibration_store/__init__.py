"""Calibration profiles (DESIGN §2.3) and their stores: memory, local file, Redis."""
