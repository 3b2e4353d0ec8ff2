"""Held-out evaluation: play a fixed panel, estimate Pass@(k,T), write the report."""
