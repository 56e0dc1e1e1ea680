"""The engine's logits against transformers' (bench/gpu/e2e.py's logits check) and the engine's logits
as it samples (bench/gpu/engine_check.py's comparisons)."""
from __future__ import annotations

from contextlib import contextmanager

import torch

TOL = {"float32": 1e-3, "bfloat16": 5e-2}  # max |logit difference| / max |logit| of a position


@contextmanager
def recorded_logits(llm):
    """Within: every sampled row's logits, as {(request id, child index): [fp32 CPU row per token]} once
    the block ends. With speculation a verify step samples several positions of a row, and a rejected
    draft's position is sampled again the next step: the last row of each position is the token's."""
    rows: dict[tuple[str, int], dict[int, torch.Tensor]] = {}
    real = llm.runner.run

    def spy(plan):
        logits, scored = real(plan)
        offsets = plan.sample_offsets or [0] * len(plan.sample_seqs)
        for seq, off, row in zip(plan.sample_seqs, offsets, logits):
            rows.setdefault((seq.request.request_id, seq.index), {})[seq.num_generated + off] = row.float().cpu()
        return logits, scored
    llm.runner.run = spy
    try:
        yield rows
    finally:
        del llm.runner.run
        for key, by_position in rows.items():
            rows[key] = [by_position[p] for p in sorted(by_position)]


def engine_logits(llm, prompts: list[list[int]], n: int, gen: int) -> list[tuple[list[int], list[int], list]]:
    """The prompts, each forked n ways, decoded greedily (the forks share their prompt's blocks: cascade
    runs); per child, (its prompt, its tokens, the logits each token was chosen from)."""
    from engine import SamplingParams
    with recorded_logits(llm) as rows:
        outs = llm.generate(prompts, SamplingParams(n=n, temperature=0.0, max_tokens=gen, ignore_eos=True),
                            use_tqdm=False)
    return [(p, o.token_ids, rows[out.request_id, o.index])
            for p, out in zip(prompts, outs) for o in sorted(out.outputs, key=lambda o: o.index)]


def hf_model(folder, dtype: str, device: str):
    """transformers' model, loaded straight onto the device (no copy through host memory)."""
    from transformers import AutoModelForCausalLM
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), device_map=device)
    except (ImportError, ValueError) as e:  # a transformers that wants accelerate for any device_map
        if "accelerate" not in str(e):
            raise
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device)
    return model.eval()


def hf_teacher_forced(model, prompt: list[int], tokens: list[int]):
    """transformers' logits for each of `tokens` given prompt + the tokens before it, [len(tokens), V]."""
    ids = torch.tensor([prompt + tokens[:-1]], device=model.device)
    with torch.no_grad():
        return model(ids, logits_to_keep=len(tokens)).logits[0].float().cpu()


def logits_check(engine_rows: list, engine_tokens: list[int], hf_logits, tol: float) -> dict:
    """A greedy trajectory of the engine against transformers teacher-forced on its tokens (every position
    has the same context in both). Passes when every position's max |logit difference| is within tol of
    its largest |logit|, and the engine's token is transformers' top-1 at every position whose top-2
    margin there is clear: above twice the position's max |difference| (within it, the two may rank the
    top two apart; beyond it, another token means the engine chose its token from other logits)."""
    k = hf_logits.shape[0]
    eng, tokens = torch.stack(engine_rows[-k:]), torch.tensor(engine_tokens[-k:])
    diff = (eng - hf_logits).abs().amax(-1)
    top2 = hf_logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * diff
    agree = tokens == hf_logits.argmax(-1)
    rel = float((diff / hf_logits.abs().amax(-1).clamp_min(1e-6)).max())
    mismatch = int((clear & ~agree).sum())
    return dict(positions=len(diff), clear_positions=int(clear.sum()), clear_mismatches=mismatch,
                top1_agree=float(agree.float().mean()), max_abs_err=float(diff.max()),
                max_abs_logit=float(hf_logits.abs().max()), max_rel_err=rel, tol=tol,
                passed=mismatch == 0 and rel <= tol)


def merge_checks(checks: list[dict]) -> dict:
    """One verdict over several children's logits_check."""
    return dict(positions=sum(c["positions"] for c in checks), clear_positions=sum(c["clear_positions"] for c in checks),
                clear_mismatches=sum(c["clear_mismatches"] for c in checks),
                top1_agree=min(c["top1_agree"] for c in checks), max_abs_err=max(c["max_abs_err"] for c in checks),
                max_abs_logit=max(c["max_abs_logit"] for c in checks), max_rel_err=max(c["max_rel_err"] for c in checks),
                tol=checks[0]["tol"], passed=all(c["passed"] for c in checks))
