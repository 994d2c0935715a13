"""Training of the tiny world's models: the base policy's SFT and the PRMs' language-model
training, plus the generation and accuracy checks both use.

* **policy** (:func:`train_policy`): next-token loss on the completion tokens only
  (``solution + <eos>``, the prompt masked), AdamW, linear warm-up then constant learning rate,
  batches of right-padded sequences drawn from per-epoch permutations of ``train``; it stops at
  ``sft_steps`` or at the first accuracy check that reaches ``sft_stop_accuracy``.
* **PRMs** (:func:`train_prm`): causal LMs that start from the base policy's weights and are
  trained further the same way on correct worked solutions (generative step verifiers,
  :class:`allocopt.rewards.verifier.LikelihoodVerifier`).

Settings: :class:`objectives.tiny.manifest.BuildSettings`. torch and transformers are imported
inside the functions.
"""

from __future__ import annotations

import random
import re
from typing import Any, Iterator, Sequence

from objectives.tiny import tasks as tt
from objectives.tiny.manifest import BuildSettings, Progress
from objectives.tiny.tasks import Problem

_CHAR_IDS = {t: i for i, t in enumerate(tt.VOCAB)}
_STEP_ID = _CHAR_IDS[tt.STEP_TOKEN]
_EOS_ID = _CHAR_IDS[tt.EOS_TOKEN]
_PAD_ID = _CHAR_IDS[tt.PAD_TOKEN]


_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in tt.SPECIAL_TOKENS) + ")")


def encode(text: str) -> list[int]:
    """Token ids of ``text`` as :func:`build_tokenizer` gives them (one per character, a
    special token such as ``<step>`` as its own id, ``<unk>`` for other characters), without
    the tokenizer's overhead."""
    ids: list[int] = []
    for i, piece in enumerate(_SPECIAL_RE.split(text)):
        if i % 2:
            ids.append(_CHAR_IDS[piece])
        else:
            ids.extend(_CHAR_IDS.get(c, _CHAR_IDS[tt.UNK_TOKEN]) for c in piece)
    return ids


def _pad(seqs: Sequence[list[int]], labels: Sequence[list[int]]):
    """Right-padded ``input_ids``, ``attention_mask``, ``labels`` (-100 on padding)."""
    import torch

    length = max(map(len, seqs))
    ids = torch.full((len(seqs), length), _PAD_ID, dtype=torch.long)
    lab = torch.full((len(seqs), length), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, (s, y) in enumerate(zip(seqs, labels)):
        ids[i, :len(s)] = torch.tensor(s)
        lab[i, :len(y)] = torch.tensor(y)
        mask[i, :len(s)] = 1
    return ids, mask, lab


def _optimizer(model: Any, lr: float, weight_decay: float, warmup: int):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98),
                            weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
    return opt, sched


def _step(loss: Any, opt: Any, sched: Any) -> float:
    """One optimizer step on ``loss`` (backward, step, zero the gradients, advance the
    schedule); returns the loss as a float."""
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    return float(loss.detach())


def _batches(n: int, batch_size: int, rng: random.Random) -> Iterator[list[int]]:
    """Index batches from per-epoch permutations of ``range(n)`` (a batch may span two)."""
    order: list[int] = []
    while True:
        while len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order += epoch
        yield order[:batch_size]
        del order[:batch_size]


# ============================================================================= policy
def generate(model: Any, prompts: Sequence[str], *, sample: bool, seed: int,
             max_new_tokens: int, batch_size: int = 256) -> list[str]:
    """Completions of ``prompts`` (greedy, or sampled at temperature 1 from seed ``seed``),
    decoded without special tokens, cut at ``<eos>``."""
    import torch

    was_training = model.training
    model.eval()
    texts: list[str] = []
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), batch_size):
            chunk = [encode(p) for p in prompts[start:start + batch_size]]
            length = max(map(len, chunk))
            ids = torch.tensor([[_PAD_ID] * (length - len(c)) + c for c in chunk])  # left
            mask = torch.tensor([[0] * (length - len(c)) + [1] * len(c) for c in chunk])
            kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample \
                else dict(do_sample=False)
            out = model.generate(input_ids=ids, attention_mask=mask,
                                 max_new_tokens=max_new_tokens, eos_token_id=_EOS_ID,
                                 pad_token_id=_PAD_ID, **kwargs)
            for row in out[:, length:].tolist():
                if _EOS_ID in row:
                    row = row[:row.index(_EOS_ID)]
                texts.append("".join(tt.VOCAB[i] for i in row if i >= len(tt.SPECIAL_TOKENS)))
    model.train(was_training)
    return texts


def accuracy(model: Any, problems: Sequence[Problem], *, sample: bool, seed: int,
             max_new_tokens: int) -> float:
    """Share of ``problems`` whose completion has the right final answer."""
    texts = generate(model, [p.prompt for p in problems], sample=sample, seed=seed,
                     max_new_tokens=max_new_tokens)
    return sum(tt.is_correct(t, p) for t, p in zip(texts, problems)) / len(problems)


def train_policy(s: BuildSettings, train: Sequence[Problem], check: Sequence[Problem],
                 progress: Progress) -> tuple[Any, dict[str, Any]]:
    """The SFT base policy and what its training did (steps run, last loss, checks)."""
    import torch

    from objectives.tiny.models import build_policy

    model = build_policy(s.policy_size, s.seed)
    model.generation_config.eos_token_id = _EOS_ID
    model.generation_config.pad_token_id = _PAD_ID
    seqs, labels = [], []
    for p in train:
        prompt, completion = encode(p.prompt), encode(p.solution) + [_EOS_ID]
        seqs.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    opt, sched = _optimizer(model, s.sft_lr, s.sft_weight_decay, s.sft_warmup)
    batches = _batches(len(seqs), s.sft_batch_size, random.Random(f"sft:{s.seed}"))
    torch.manual_seed(s.seed)
    model.train()
    checks: list[dict[str, float]] = []
    loss_value, step = float("nan"), 0
    for step in range(1, s.sft_steps + 1):
        idx = next(batches)
        ids, mask, lab = _pad([seqs[i] for i in idx], [labels[i] for i in idx])
        loss_value = _step(model(input_ids=ids, attention_mask=mask, labels=lab).loss, opt, sched)
        if step % 100 == 0:
            progress(f"sft step {step}/{s.sft_steps} loss {loss_value:.4f}")
        if s.sft_stop_accuracy is not None and step >= s.sft_check_from \
                and (step - s.sft_check_from) % s.sft_check_every == 0:
            acc = accuracy(model, check, sample=True, seed=s.seed + 7,
                           max_new_tokens=s.max_new_tokens)
            checks.append({"step": step, "sampled_accuracy": acc})
            progress(f"sft check at step {step}: sampled accuracy {acc:.3f}")
            if acc >= s.sft_stop_accuracy:
                break
    model.eval()
    return model, {"steps_run": step, "final_loss": loss_value, "checks": checks}


# ============================================================================ PRMs
def train_prm(size: str, steps: int, lr: float, data: Sequence[Problem], s: BuildSettings,
              progress: Progress, init: Any = None) -> tuple[Any, dict[str, Any]]:
    """``build_prm(size)`` (a causal LM) trained ``steps`` AdamW steps as a language model on
    the correct worked solutions of ``data`` (next-token loss on ``solution + <eos>``, the
    prompt masked, as the policy's SFT), and what the training did. A step verifier: it
    learns what a right step looks like, and :class:`allocopt.rewards.verifier.LikelihoodVerifier`
    scores a step by the likelihood of its line.

    ``init`` (a model, e.g. the SFT'd base policy): its weights that fit (same name and shape)
    are copied in first, as real PRMs start from the instruct model they judge; with the
    default sizes the ``full`` PRM is the base policy's shape (every weight copied) and the
    ``proxy`` its first three layers (embedding, those layers, final norm copied)."""
    import torch

    from objectives.tiny.models import build_prm

    model = build_prm(size, s.seed)
    copied = 0
    if init is not None:
        own = model.state_dict()
        fit = {k: v for k, v in init.state_dict().items() if k in own and own[k].shape == v.shape}
        model.load_state_dict(fit, strict=False)
        copied = len(fit)
    seqs, labels = [], []
    for p in data:
        prompt, completion = encode(p.prompt), encode(p.solution) + [_EOS_ID]
        seqs.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    opt, _ = _optimizer(model, lr, 0.0, s.prm_warmup)
    # linear warm-up, then linear decay to a tenth of lr at the last step
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(
        (i + 1) / max(1, s.prm_warmup), max(0.1, 1 - 0.9 * i / max(1, steps))))
    batches = _batches(len(seqs), s.prm_batch_size, random.Random(f"prm:{size}:{s.seed}"))
    torch.manual_seed(s.seed)
    model.train()
    loss_value = float("nan")
    for step in range(1, steps + 1):
        idx = next(batches)
        ids, mask, lab = _pad([seqs[i] for i in idx], [labels[i] for i in idx])
        loss_value = _step(model(input_ids=ids, attention_mask=mask, labels=lab).loss, opt, sched)
        if step % 100 == 0:
            progress(f"{size} prm step {step}/{steps} loss {loss_value:.4f}")
    model.eval()
    return model, {"steps_run": steps, "final_loss": loss_value, "tensors_from_policy": copied}


__all__ = ["accuracy", "encode", "generate", "train_policy", "train_prm"]
