"""The metered GRPO driver every GRPO objective trains with: one real trial (TRL ``GRPOTrainer``
+ peft LoRA) under a hard FLOP budget (:mod:`allocopt.grpo.driver`), its hooks around TRL's loop
(:mod:`allocopt.grpo.hooks`) and the patch that lets TRL sync weights into vLLM's CPU build
(:mod:`allocopt.grpo.vllm_cpu`). torch, TRL, peft and vLLM are imported inside functions only."""
