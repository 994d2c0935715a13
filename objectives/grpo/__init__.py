"""The GRPO driver: one real trial (TRL ``GRPOTrainer`` + peft LoRA) under a hard FLOP budget (:mod:`objectives.grpo.driver`), with its hooks around TRL's loop (:mod:`objectives.grpo.hooks`)."""
