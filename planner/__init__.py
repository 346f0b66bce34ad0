"""Capacity planning: stage cost profiles (costs.py) measured on a machine (profile_stages.py)."""
