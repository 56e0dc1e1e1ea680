"""LLM.generate from several threads at once: each call gets its own outputs, none is disturbed."""
import threading

from engine import LLM, SamplingParams


def test_generate_from_several_threads_gives_each_its_own_outputs(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = {t: [[t * 10 + i, 3, 4 + i] for i in range(3)] for t in range(4)}
    alone = {t: [o.outputs[0].token_ids for o in llm.generate(p, greedy, use_tqdm=False)]
             for t, p in prompts.items()}
    start, got, errors = threading.Barrier(len(prompts)), {}, []

    def run(t):
        start.wait()
        try:
            got[t] = [o.outputs[0].token_ids for o in llm.generate(prompts[t], greedy, use_tqdm=False)]
        except Exception as e:  # a StepError or "left the engine unfinished" from a neighbour's steps
            errors.append(e)
    threads = [threading.Thread(target=run, args=(t,)) for t in prompts]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors and got == alone
    assert not llm.has_unfinished()
