"""Reward systems: rule-based (``sparse``, ``structured``, ``dense``) and model-based (``proxy_prm``, ``prm``) step scorers, built by name in :mod:`objectives.rewards.systems`."""
