"""Evaluation core (DESIGN §2.7): orderings, accuracy, RStd, consistency, confusion."""
