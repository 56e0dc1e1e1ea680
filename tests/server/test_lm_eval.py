"""lm-eval's ``local-completions`` against ``pacore serve`` on the embedded model, both task kinds: a tiny
multiple-choice task (loglikelihoods via echo + logprobs) and a tiny generate_until task, each a YAML over a
JSONL written here. lm-eval (the dev extra) runs as its command line, the one docs/serving.md shows."""
import glob
import json
import os
import socket
import subprocess
import sys

import httpx
import pytest

from server_helpers import metrics, wait_until

pytest.importorskip("lm_eval", reason="lm-eval is in the dev extra: pip install -e '.[dev]'")

MODEL = "smollm2-135m"
# Items SmolLM2-135M gets right by a wide margin (the right choice's loglikelihood leads by more than 4 nats;
# the greedy continuations are transformers' own), so a wrong score or a mangled prompt changes the accuracy.
MC_ITEMS = [
    {"question": "The capital of France is", "choices": ["Paris", "banana", "seven"], "answer": 0},
    {"question": "Monday, Tuesday, Wednesday,", "choices": ["Sunday", "Thursday", "apple"], "answer": 1},
    {"question": "One, two, three, four,", "choices": ["nine", "red", "five"], "answer": 2},
    {"question": "The opposite of hot is", "choices": ["cold", "blue", "Tuesday"], "answer": 0},
    {"question": "A, B, C, D,", "choices": ["Q", "E", "7"], "answer": 1},
    {"question": "Water freezes at zero degrees", "choices": ["Kilometers", "Celsius"], "answer": 1},
]
GEN_ITEMS = [
    {"question": "One, two, three, four,", "answer": "five"},
    {"question": "1, 2, 3, 4,", "answer": "5"},
    {"question": "A, B, C, D,", "answer": "E"},
    {"question": "The capital of France is", "answer": "Paris"},
]
MC_YAML = """\
task: pacore_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
GEN_YAML = """\
task: pacore_tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: [",", ".", "\\n"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    regexes_to_ignore: [" "]
"""


def _write_tasks(root) -> None:
    for name, items, yaml in (("mc", MC_ITEMS, MC_YAML), ("gen", GEN_ITEMS, GEN_YAML)):
        data = root / f"{name}.jsonl"
        data.write_text("".join(json.dumps(item) + "\n" for item in items))
        (root / f"pacore_tiny_{name}.yaml").write_text(yaml.format(data=data))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pacore_serve(tmp_path):
    """``pacore serve`` on the default model in a subprocess; yields its base URL."""
    port = _free_port()
    with open(tmp_path / "serve.log", "wb") as log:  # the child keeps its own
        proc = subprocess.Popen([sys.executable, "-m", "pacore", "serve", "--port", str(port), "--max-model-len",
                                 "512", "--num-kv-blocks", "64"], stdout=log, stderr=subprocess.STDOUT,
                                env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(f"{base}/health").status_code == 200
        except httpx.TransportError:
            return proc.poll() is not None  # died: said below
    try:
        wait_until(up, "pacore serve to start", 180)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _start_lm_eval(base: str, tasks_dir, out_dir, tasks: list[str], remote: bool = False) -> subprocess.Popen:
    """lm-eval's command line on ``tasks``, its stdout and stderr going to files in ``out_dir``; ``remote``:
    the tokenizer taken from the server (tokenizer_backend=remote: /tokenizer_info, /tokenize, /detokenize)
    instead of the model's folder."""
    from engine.default_model import resolve_model
    tokenizer = "tokenizer_backend=remote" if remote else f"tokenizer={resolve_model(None)},tokenizer_backend=huggingface"
    model_args = f"base_url={base}/v1/completions,model={MODEL},{tokenizer},num_concurrent=1,max_retries=1"
    env = dict(os.environ, HF_DATASETS_CACHE=str(out_dir / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out_dir.mkdir()
    with open(out_dir / "stdout.txt", "w") as out, open(out_dir / "stderr.txt", "w") as err:  # the child keeps its own
        return subprocess.Popen([sys.executable, "-m", "lm_eval", "run", "--model", "local-completions",
                                 "--model_args", model_args, "--tasks", *tasks, "--include_path", str(tasks_dir),
                                 "--output_path", str(out_dir), "--log_samples"], stdout=out, stderr=err, env=env)


def _samples(out_dir, task: str) -> list[dict]:
    (path,) = glob.glob(str(out_dir / "**" / f"samples_{task}_*.jsonl"), recursive=True)
    with open(path) as f:
        return [json.loads(line) for line in f]


def _engine_scores(contexts_and_continuations: list[tuple[str, str]]) -> list[tuple[float, bool]]:
    """Each continuation's (log-likelihood after its context, whether every token of it is the argmax), from the
    engine directly (prompt logprobs), the prompt split into tokens as lm-eval splits it (context + continuation
    encoded whole, no BOS)."""
    from engine import LLM, SamplingParams
    llm = LLM(MODEL, num_kv_blocks=64, max_model_len=512)
    prompts, starts = [], []
    for context, continuation in contexts_and_continuations:
        prompts.append(llm.tokenizer.encode(context + continuation, add_special_tokens=False))
        starts.append(len(llm.tokenizer.encode(context, add_special_tokens=False)))
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    scores = []
    for out, ids, start in zip(outs, prompts, starts):
        chosen = [out.prompt_logprobs[i][ids[i]] for i in range(start, len(ids))]
        scores.append((sum(lp.logprob for lp in chosen), all(lp.rank == 1 for lp in chosen)))
    return scores


@pytest.mark.slow
def test_lm_eval_takes_the_tokenizer_from_pacore_serve(pacore_serve, tmp_path):
    # issue 47: tokenizer_backend=remote (and auto) read GET /tokenizer_info, got 404, and then tried to
    # download a tokenizer named after the served model. HF_HUB_OFFLINE=1: no tokenizer comes from elsewhere.
    tasks_dir, out_dir = tmp_path / "tasks", tmp_path / "out"
    tasks_dir.mkdir()
    _write_tasks(tasks_dir)
    run = _start_lm_eval(pacore_serve, tasks_dir, out_dir, ["pacore_tiny_mc", "pacore_tiny_gen"], remote=True)
    try:
        returncode = run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    stdout, stderr = (out_dir / "stdout.txt").read_text(), (out_dir / "stderr.txt").read_text()
    assert returncode == 0, stdout[-3000:] + stderr[-6000:]
    assert "Using remote tokenizer" in stderr and "API request failed" not in stderr, stderr[-6000:]
    (results_path,) = glob.glob(str(out_dir / "**" / "results_*.json"), recursive=True)
    with open(results_path) as f:
        results = json.load(f)["results"]
    assert results["pacore_tiny_mc"]["acc,none"] == 1.0, [s["resps"] for s in _samples(out_dir, "pacore_tiny_mc")]
    assert results["pacore_tiny_gen"]["exact_match,none"] == 1.0, [s["resps"] for s in _samples(out_dir, "pacore_tiny_gen")]
    # The loglikelihoods are the engine's own, the prompt split as the model's tokenizer splits it.
    pairs = [(item["question"], " " + choice) for item in MC_ITEMS for choice in item["choices"]]
    served = [float(r[0][0]) for sample in _samples(out_dir, "pacore_tiny_mc") for r in sample["resps"]]
    assert served == pytest.approx([x for x, _ in _engine_scores(pairs)], abs=1e-4)


@pytest.mark.slow
def test_lm_eval_scores_both_task_kinds_against_pacore_serve(pacore_serve, tmp_path):
    tasks_dir, out_dir = tmp_path / "tasks", tmp_path / "out"
    tasks_dir.mkdir()
    _write_tasks(tasks_dir)
    run = _start_lm_eval(pacore_serve, tasks_dir, out_dir, ["pacore_tiny_mc", "pacore_tiny_gen"])
    # What lm-eval scores: each choice after its question, joined by its default target_delimiter " ".
    pairs = [(item["question"], " " + choice) for item in MC_ITEMS for choice in item["choices"]]
    try:
        direct = _engine_scores(pairs)  # meanwhile, on the test's own engine
        returncode = run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    stdout, stderr = (out_dir / "stdout.txt").read_text(), (out_dir / "stderr.txt").read_text()
    assert returncode == 0, stdout[-3000:] + stderr[-6000:]
    assert "API request failed" not in stderr, stderr[-6000:]
    print(stdout)  # lm-eval's table: pytest -s shows it

    (results_path,) = glob.glob(str(out_dir / "**" / "results_*.json"), recursive=True)
    with open(results_path) as f:
        results = json.load(f)["results"]
    accuracy, exact = results["pacore_tiny_mc"]["acc,none"], results["pacore_tiny_gen"]["exact_match,none"]
    print(f"pacore_tiny_mc acc = {accuracy}, pacore_tiny_gen exact_match = {exact}")
    assert accuracy == 1.0, [s["resps"] for s in _samples(out_dir, "pacore_tiny_mc")]
    assert exact == 1.0, [s["resps"] for s in _samples(out_dir, "pacore_tiny_gen")]

    # Every request lm-eval sent was answered once, with no error or retry: one per (question, choice) and
    # one per generation question.
    requests = sum(len(item["choices"]) for item in MC_ITEMS) + len(GEN_ITEMS)
    counts = {k: v for k, v in metrics(pacore_serve).items() if k.startswith("pacore_requests_total")}
    assert counts == {"pacore_requests_total{endpoint=completions,outcome=ok}": requests}, counts

    # The loglikelihoods lm-eval scored (token_logprobs) are the engine's own, computed directly, and so is
    # whether each continuation is greedy (lm-eval reads it from top_logprobs).
    scored, served = [], []
    for sample in _samples(out_dir, "pacore_tiny_mc"):
        for arg, ((loglik, greedy),) in zip(sample["arguments"].values(), sample["resps"]):
            scored.append((arg["arg_0"], arg["arg_1"]))
            served.append((float(loglik), greedy == "True"))  # the samples file holds str(float): exact
    assert scored == pairs
    assert [g for _, g in served] == [g for _, g in direct]
    assert [x for x, _ in served] == pytest.approx([x for x, _ in direct], abs=1e-4)
