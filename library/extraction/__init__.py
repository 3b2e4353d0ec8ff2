"""Extraction: distil finished episodes into candidate lessons (deterministic rules or an LLM)."""
