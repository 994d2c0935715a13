"""Reward systems an objective scores completions with: rule-based (``sparse``, ``structured``,
``dense``) and model-based (``proxy_prm``, ``prm``) step scorers, built by name in
:mod:`allocopt.rewards.systems`; the public PRMs read by their card formats
(:mod:`allocopt.rewards.prm`); what they read of a completion (:mod:`allocopt.rewards.step_parsing`,
:mod:`allocopt.rewards.answers`). torch and transformers are imported only when a model runs."""
