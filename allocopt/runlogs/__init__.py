"""Account an existing GRPO run from its logs: a TRL output folder, a verl console log, an
OpenRLHF console log or TensorBoard folder, a NeMo-RL TensorBoard folder.

Standard library only (TensorBoard event files: the optional ``tensorboard`` package). ``import_trl(path, **overrides)`` and ``import_verl(path, **overrides)``
read what the run wrote (lengths per step, batch sizes, passes, KL, LoRA rank, timings), fill
the rest with stated assumptions, and return an :class:`ImportedRun` whose ``account`` holds
the useful and executed FLOPs of the whole run per phase. ``overrides`` are
:data:`allocopt.plan.recipe.RECIPE_KEYS` (``model``, ``lora_rank``, ``engine``, …) and win
over the log. Bad or missing input raises :class:`RunLogError` with one line naming the file,
the field and what is wrong.
"""

from allocopt.runlogs.accounting import Accounting, account_any
from allocopt.runlogs.common import ImportedRun, RunLogError
from allocopt.runlogs.nemo_rl import import_nemo_rl
from allocopt.runlogs.openrlhf import import_openrlhf
from allocopt.runlogs.trl import import_trl
from allocopt.runlogs.verl import import_verl

__all__ = ["Accounting", "ImportedRun", "account_any", "RunLogError", "import_nemo_rl", "import_openrlhf", "import_trl",
           "import_verl"]
