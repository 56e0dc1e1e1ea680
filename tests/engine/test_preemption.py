"""A cache too small for everything at once: sequences are preempted, recomputed, never lost."""
import torch

from engine import LLM, SamplingParams


def _prompt(n, seed=0):
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_small_cache_same_greedy_output(tiny_model_dir):
    model = str(tiny_model_dir("qwen2"))
    prompts = [_prompt(40 + 7 * i, seed=i) for i in range(5)]
    params = [SamplingParams(n=1 + i % 3, temperature=0, max_tokens=48, ignore_eos=True) for i in range(5)]
    big = LLM(model, num_kv_blocks=512)
    expected = big.generate(prompts, params, use_tqdm=False)
    small = LLM(model, num_kv_blocks=14)  # one sequence needs up to 7 blocks
    got = small.generate(prompts, params, use_tqdm=False)
    assert [[o.token_ids for o in r.outputs] for r in got] == \
        [[o.token_ids for o in r.outputs] for r in expected]
    assert small.stats()["preemptions"] > 0
    assert big.stats()["preemptions"] == 0
    assert small.block_manager.num_used == 0


def test_seeded_sampling_survives_preemption(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    prompt = _prompt(30, seed=9)
    params = SamplingParams(n=6, temperature=1.0, seed=5, max_tokens=40, ignore_eos=True)
    a = LLM(model, num_kv_blocks=512).generate([prompt], params, use_tqdm=False)[0]
    small = LLM(model, num_kv_blocks=8)
    b = small.generate([prompt], params, use_tqdm=False)[0]
    assert small.stats()["preemptions"] > 0
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]


def test_max_num_seqs_smaller_than_n(tiny_model_dir):
    model = str(tiny_model_dir("qwen3"))
    prompt = _prompt(20, seed=4)
    params = SamplingParams(n=5, temperature=0, max_tokens=6, ignore_eos=True)
    out = LLM(model, num_kv_blocks=128, max_num_seqs=2).generate([prompt], params, use_tqdm=False)[0]
    assert len(out.outputs) == 5 and len({tuple(o.token_ids) for o in out.outputs}) == 1


def test_a_prompt_is_admitted_only_when_its_whole_prefill_fits():
    """A sequence admitted for its first chunk into a nearly full cache would be preempted before its
    prefill ends: it waits until all of it fits, with the 1% watermark kept free for growth."""
    from engine.core.block_manager import BlockManager
    from engine.core.cascade import CascadePolicy
    from engine.core.scheduler import Scheduler
    from engine.core.sequence import Request
    from engine.core.stopping import StopChecker

    bm = BlockManager(200, 16)
    sched = Scheduler(bm, StopChecker(None, [], 1 << 20), 8, 64, CascadePolicy())
    assert sched.watermark == 2

    def add(rid, tokens, first=0):
        req = Request(rid, None, list(range(first, first + tokens)), SamplingParams(max_tokens=8))
        sched.add_request(req)
        return req.seqs[0]
    running = add("a", 16 * 150)
    for _ in range(200):  # prefill it: 150 of the 200 blocks
        if running.num_generated:
            break
        plan = sched.schedule()
        sched.postprocess(plan, [(seq, [5], i) for i, seq in enumerate(plan.sample_seqs)])
    assert running.num_generated == 1
    waiting = add("b", 16 * 48, first=5000)  # 49 blocks are free: its first 64-token chunk fits, the whole prompt would leave 1
    plan = sched.schedule()
    assert [s for s, _ in plan.prefills] == [] and list(sched.waiting) == [waiting]
    sched.finish(running)
    plan = sched.schedule()
    assert [s for s, _ in plan.prefills] == [waiting]
