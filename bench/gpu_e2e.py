"""The engine end to end on a Qwen3-8B-shaped random bf16 checkpoint, YaRN to 131k: stages of the GPU
plan (bench/gpu_check.sh runs it in parts with --only; a run keeps the sections of earlier runs into the
same --out, and --checkpoint lets them share one written checkpoint).

One file past 300 lines: every engine section of the GPU run is here.

Sections (each is written to $OUT/gpu_e2e.json as soon as it ran, so a timeout keeps what ran):
- load: load time, memory after loading, and the KV tokens the default sizing gives;
- logits: a forked prompt decoded greedily with cascade and CUDA graphs both on and both off; every
  step's logits against transformers teacher-forced on the same tokens (top-1 agreement, max error);
- throughput: round 1 (512-token prompts, n=32) and round 2 (16k prompts, n=4) decode tokens/s with
  cascade on and off, and past_64k (a 64k prompt, n=4), which decodes past position 65,535 and is
  checked against transformers there (--cases picks among them);
- hf: transformers `generate` at round 1's batch, the baseline the engine is compared to;
- fp8: round 1 and round 2 again (cascade on) with each --fp8 KV cache format: decode tokens/s next to
  the bf16 cache's, and the KV tokens the default sizing gives.
Every engine and transformers model is dropped (shut down, its memory back to the device) before the
next one loads, and each section prints and records the device memory free when it starts and ends
("memory" in the json).
$OUT/device_params.json gets the engine's numbers next to the kernels' (bench/gpu_kernels.py).
The weights are random (shapes and dtype set the speed, not the values).

    python3 -m bench.gpu_e2e [--out DIR] [--only load,logits,throughput,hf,fp8] [--cases round1,round2,past_64k]
                             [--fp8 fp8_e4m3,fp8_e5m2] [--checkpoint DIR]
    python3 -m bench.gpu_e2e --tiny      # CPU, a 2-layer model at tiny sizes: checks the code path
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from bench.gpu_kernels import commit, write_device_params
from engine.testing import write_char_tokenizer

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="yarn", rope_theta=1_000_000.0, factor=4.0,
                                     original_max_position_embeddings=32768))
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0))  # bench/pacore_throughput.py
TINY = dict(QWEN3_8B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
            tie_word_embeddings=True, rope_parameters=dict(rope_type="yarn", rope_theta=1_000_000.0, factor=4.0,
                                                           original_max_position_embeddings=1024))
SECTIONS = ("load", "logits", "throughput", "hf", "fp8")
CASES = ("round1", "round2", "past_64k")


def write_random_model(folder: str | Path, shape: dict = QWEN3_8B, dtype: str = "bfloat16", seed: int = 0,
                       device: str = "cpu", shard_bytes: int = 4 << 30) -> Path:
    """A Qwen3 checkpoint with random N(0, 0.02) weights (norms at 1), in safetensors shards of about
    shard_bytes, drawn on `device` (a GPU draws 8B values in seconds). Parameter names come from a
    transformers model built on the meta device."""
    import torch
    import transformers
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = transformers.Qwen3Config(bos_token_id=2, eos_token_id=1, pad_token_id=0, **shape)
    cfg.architectures = ["Qwen3ForCausalLM"]
    with torch.device("meta"):
        names = {k: v.shape for k, v in transformers.Qwen3ForCausalLM(cfg).state_dict().items()}
    g = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, dtype)
    shards, cur, size, weight_map = [], {}, 0, {}
    for name, shp in names.items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        t = torch.ones(shp, device=device) if name.endswith("norm.weight") else \
            torch.randn(shp, generator=g, device=device) * 0.02
        cur[name] = t.to(dt).cpu().contiguous()
        size += cur[name].nbytes
        if size >= shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
    shards.append(cur)
    for i, tensors in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors"
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in tensors})
    if len(shards) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg.dtype = dtype
    cfg.save_pretrained(folder)
    write_char_tokenizer(folder, cfg.vocab_size)
    return folder


def checkpoint_folder(path: Path, shape: dict, dtype: str, device: str) -> Path:
    """The random checkpoint at path, written there first unless a complete one is (the stages of one
    GPU plan share it; `complete` is written last)."""
    if not (path / "complete").is_file():
        write_random_model(path, shape, dtype, device=device)
        (path / "complete").write_text(json.dumps(dict(shape=shape, dtype=dtype)))
    elif json.loads((path / "complete").read_text()) != json.loads(json.dumps(dict(shape=shape, dtype=dtype))):
        raise ValueError(f"{path} holds another model than this run's; delete it or pass another --checkpoint")
    return path


class Run:
    def __init__(self, args, device: str, dtype: str, shape: dict):
        self.args, self.device, self.dtype, self.shape = args, device, dtype, shape
        self.report: dict = dict(commit=commit(), dtype=dtype)
        path = Path(args.out or "") / "gpu_e2e.json"
        if args.out and path.is_file():  # an earlier stage's sections, unless this run redoes them
            redo = set(args.only.split(",")) - {"throughput"}  # whose rows are redone case by case
            redo |= {f"{s}_error" for s in args.only.split(",")}
            if "throughput" in args.only.split(",") and "past_64k" in args.cases.split(","):
                redo.add("past_64k_logits")
            self.report = {k: v for k, v in json.loads(path.read_text()).items() if k not in redo}
            self.report.update(commit=commit(), dtype=dtype)

    def save(self, section: str, data) -> None:
        self.report[section] = data
        print(f"== {section}: {json.dumps(data[-1] if isinstance(data, list) else data)[:2000]}", flush=True)
        self._write()

    def _write(self) -> None:
        if self.args.out:
            Path(self.args.out).mkdir(parents=True, exist_ok=True)
            (Path(self.args.out) / "gpu_e2e.json").write_text(json.dumps(self.report, indent=1))

    def engine(self, **kw):
        """An LLM on the checkpoint; use it as `with run.engine(...) as llm:`, so that its memory is
        released (shutdown) before the next engine or model loads."""
        from engine import LLM
        return LLM(str(self.folder), dtype=self.dtype, device=self.device, record_steps=True, **kw)

    def free(self) -> None:
        """After the caller dropped its engine or model: collect, give the memory back to the device."""
        import torch
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    def memory(self, label: str) -> None:
        """Print and record the device memory free now (where each section starts and ends)."""
        import torch
        if self.device != "cuda":
            entry = dict(at=label)
        else:
            free, total = torch.cuda.mem_get_info()
            entry = dict(at=label, free_GB=free / 1e9, total_GB=total / 1e9,
                         allocated_GB=torch.cuda.memory_allocated() / 1e9)
        print(f"== memory {json.dumps(entry)}", flush=True)
        self.report.setdefault("memory", []).append(entry)
        self._write()


def section_load(run: Run) -> None:
    import torch
    cuda = run.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    with run.engine(enforce_eager=True) as llm:  # the default KV sizing (gpu_memory_utilization)
        load_s = time.perf_counter() - t
        st = llm.stats()
        weights = sum(p.numel() * p.element_size() for p in llm.runner.model.parameters())
        data = dict(load_s=load_s, weights_GB=weights / 1e9, kv_tokens=st["kv_blocks_total"] * llm.runner.block_size,
                    kv_blocks=st["kv_blocks_total"], kv_GB=st["kv_blocks_total"] * st["kv_bytes_per_block"] / 1e9)
        if cuda:
            free, total = torch.cuda.mem_get_info()
            data.update(peak_allocated_GB=torch.cuda.max_memory_allocated() / 1e9, device_total_GB=total / 1e9,
                        device_free_GB=free / 1e9)
    del llm
    run.free()
    run.save("load", data)
    write_device_params(run.args.out, engine=dict(load_s=load_s, weights_GB=data["weights_GB"],
                                                  kv_tokens=data["kv_tokens"]))


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


def _engine_logits(llm, prompt: list[int], n: int, gen: int):
    """One prompt forked n ways (seeded sampling, so the children differ); per child (by index) its
    tokens and the logits each token was drawn from."""
    from engine import SamplingParams
    with recorded_logits(llm) as rows:
        out = llm.generate([prompt], SamplingParams(n=n, temperature=1.0, seed=0, max_tokens=gen, ignore_eos=True),
                           use_tqdm=False)[0]
    outs = sorted(out.outputs, key=lambda o: o.index)
    return [o.token_ids for o in outs], [rows[out.request_id, o.index] for o in outs]


def _hf_model(run: Run):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(run.folder, dtype=getattr(torch, run.dtype)).to(run.device).eval()


def _hf_teacher_forced(model, prompt: list[int], tokens: list[int]):
    """transformers' logits for each of `tokens` given prompt + the tokens before it, [len(tokens), V]."""
    import torch
    ids = torch.tensor([prompt + tokens[:-1]], device=model.device)
    with torch.no_grad():
        return model(ids, logits_to_keep=len(tokens)).logits[0].float().cpu()


def _compare(engine_rows: list, hf_logits) -> dict:
    import torch
    eng = torch.stack(engine_rows[-hf_logits.shape[0]:])
    return dict(top1_agree=float((eng.argmax(-1) == hf_logits.argmax(-1)).float().mean()),
                max_abs_err=float((eng - hf_logits).abs().max()), max_abs_logit=float(hf_logits.abs().max()))


def section_logits(run: Run) -> None:
    import torch
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, run.shape["vocab_size"], (300,), generator=g).tolist()
    n, gen = 4, 24
    results = {}
    # Both on (the engine as it runs by default) and both off; the other pairs are the tiny engine
    # check's (bench/gpu_engine_check.py). On CPU there are no graphs.
    for cascade, graphs in ((True, run.device == "cuda"), (False, False)):
        with run.engine(cascade_attention=cascade, cascade_min_shared_tokens=0, enforce_eager=not graphs,
                        num_kv_blocks=512, max_num_seqs=8) as llm:
            results[f"cascade={cascade} graphs={graphs}"] = _engine_logits(llm, prompt, n, gen)
        del llm
        run.free()
    model = _hf_model(run)
    table = {}
    for name, (tokens, rows) in results.items():
        per_child = [_compare(r, _hf_teacher_forced(model, prompt, t)) for t, r in zip(tokens, rows)]
        table[name] = dict(top1_agree=min(c["top1_agree"] for c in per_child),
                           max_abs_err=max(c["max_abs_err"] for c in per_child),
                           max_abs_logit=max(c["max_abs_logit"] for c in per_child),
                           same_tokens_as_first=tokens == next(iter(results.values()))[0])
    del model
    run.free()
    run.save("logits", table)


def _decode_rate(llm, prompts, n: int, gen: int) -> dict:
    from engine import SamplingParams
    n0 = len(llm.step_log)
    t = time.perf_counter()
    llm.generate(prompts, SamplingParams(n=n, max_tokens=gen, ignore_eos=True, temperature=0), use_tqdm=False)
    wall = time.perf_counter() - t
    steps = llm.step_log[n0:]
    decode = [s for s in steps if s.kind == "decode"]
    decode_s = sum(s.schedule_s + s.model_s + s.sample_s for s in decode)
    return dict(wall_s=wall, gen_tokens=len(prompts) * n * gen, e2e_tok_s=len(prompts) * n * gen / wall,
                decode_tok_s=sum(s.num_decode_seqs for s in decode) / decode_s if decode_s else 0.0,
                decode_steps=len(decode), cascade_steps=sum(s.cascade for s in decode),
                decode_ms_per_step=1e3 * decode_s / max(1, len(decode)))


def _cases(tiny: bool) -> list[tuple]:
    """(name, prompt length, n, problems, generated tokens) of the throughput cases;
    past_64k: positions past 65,535 (tiny: past its YaRN original context, 1024)."""
    return [("round1", 64, 4, 2, 8), ("round2", 200, 3, 1, 8), ("past_64k", 1100, 2, 1, 8)] if tiny else \
        [("round1", 512, 32, 8, 128), ("round2", 16384, 4, 2, 128), ("past_64k", 65536, 4, 1, 64)]


def _measure(run: Run, llm, case: tuple, **marks) -> tuple[list, dict]:
    """One throughput case on llm: (its prompts, its row). The prompts depend on the case alone, so every
    engine (cascade on and off, FP8) and every stage decodes the same ones."""
    import torch
    name, plen, n, problems, gen = case
    g = torch.Generator().manual_seed(2 + CASES.index(name))
    prompts = torch.randint(3, run.shape["vocab_size"], (problems, plen), generator=g).tolist()
    # warm-up (compiles) on other tokens, so the prefix cache gives the measured run nothing
    _decode_rate(llm, [[(t * 7 + 1) % (run.shape["vocab_size"] - 3) + 3 for t in p[:64]] for p in prompts], n, 4)
    return prompts, dict(case=name, prompt_len=plen, n=n, problems=problems, **marks,
                         **_decode_rate(llm, prompts, n, gen), max_position=plen + gen - 1)


def section_throughput(run: Run) -> None:
    cases = [c for c in _cases(run.args.tiny) if c[0] in run.args.cases.split(",")]
    rows = [r for r in run.report.get("throughput", []) if r["case"] not in run.args.cases.split(",")]
    long_check = None
    for cascade in (True, False):
        with run.engine(cascade_attention=cascade, max_num_seqs=256) as llm:
            for case in cases:
                name, _, _, _, gen = case
                prompts, r = _measure(run, llm, case, cascade=cascade, kv_dtype=llm.stats()["kv_cache_dtype"])
                rows.append(r)
                run.save("throughput", rows)
                write_device_params(run.args.out, engine=dict(decode_tok_s={
                    f"{name}_cascade" if cascade else f"{name}_paged": r["decode_tok_s"]}))
                if name == "past_64k" and cascade:  # the long-context decodes, checked after this engine is freed
                    long_check = (prompts[0], *_engine_logits(llm, prompts[0], 1, gen))
        del llm
        run.free()
    if long_check is not None:
        model = _hf_model(run)
        prompt, tokens, eng_rows = long_check
        cmp = _compare(eng_rows[0], _hf_teacher_forced(model, prompt, tokens[0]))
        del model
        run.free()
        run.save("past_64k_logits", dict(first_position=len(prompt), last_position=len(prompt) + len(tokens[0]) - 1,
                                         **cmp))


def section_hf(run: Run) -> None:
    import torch
    tiny = run.args.tiny
    plen, batch, gen = (64, 8, 8) if tiny else (512, 256, 64)  # round 1's batch: 8 problems x 32
    model = _hf_model(run)
    ids = torch.randint(3, run.shape["vocab_size"], (batch, plen), generator=torch.Generator().manual_seed(3))
    ids = ids.to(run.device)
    kw = dict(max_new_tokens=gen, min_new_tokens=gen, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :16], **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up
        t = time.perf_counter()
        model.generate(ids, **kw)
        if run.device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
    del model, ids
    run.free()
    data = dict(prompt_len=plen, batch=batch, gen=gen, wall_s=wall, tok_s=batch * gen / wall)
    r1 = next((r for r in run.report.get("throughput", []) if r["case"] == "round1" and r["cascade"]), None)
    if r1:
        data["engine_round1_decode_tok_s"] = r1["decode_tok_s"]
        data["engine_vs_hf"] = r1["decode_tok_s"] / data["tok_s"]
    run.save("hf", data)
    write_device_params(run.args.out, engine=dict(hf_generate_tok_s=data["tok_s"], engine_vs_hf=data.get("engine_vs_hf")))


def section_fp8(run: Run) -> None:
    auto = {r["case"]: r for r in run.report.get("throughput", []) if r["cascade"]}
    rows = []
    for fmt in run.args.fp8.split(","):
        with run.engine(cascade_attention=True, max_num_seqs=256, kv_cache_dtype=fmt) as llm:
            st = llm.stats()  # the format the engine reports, so a flag it ignored would show
            kv_tokens = st["kv_blocks_total"] * llm.runner.block_size
            write_device_params(run.args.out, engine={f"kv_tokens_{fmt}": kv_tokens})
            for case in _cases(run.args.tiny)[:2]:  # round 1's and round 2's prompts of the throughput section
                _, r = _measure(run, llm, case, cascade=True, kv_dtype=st["kv_cache_dtype"], kv_tokens=kv_tokens,
                                kv_bytes_per_token=st["kv_bytes_per_token"])
                if r["case"] in auto:
                    r["decode_vs_auto"] = r["decode_tok_s"] / auto[r["case"]]["decode_tok_s"]
                rows.append(r)
                run.save("fp8", rows)
                write_device_params(run.args.out,
                                    engine={f"decode_tok_s_{fmt}": {f"{r['case']}_cascade": r["decode_tok_s"]}})
        del llm
        run.free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny model and sizes (a check of the code path)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="folder for gpu_e2e.json")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--cases", default=",".join(CASES), help=f"the throughput section's cases, of {','.join(CASES)}")
    ap.add_argument("--model", default=None, help="an existing checkpoint folder instead of writing one")
    ap.add_argument("--checkpoint", default=None,
                    help="where the random checkpoint is written once and then reused (default: a new temp folder)")
    ap.add_argument("--fp8", default="fp8_e4m3", help="KV cache formats of the fp8 section (fp8_e4m3, fp8_e5m2)")
    args = ap.parse_args(argv)
    import torch
    if args.tiny:
        run = Run(args, "cpu", "float32", TINY)
    elif not torch.cuda.is_available():
        print("gpu_e2e: no CUDA device (use --tiny on CPU)", file=sys.stderr)
        return 2
    else:
        run = Run(args, "cuda", "bfloat16", QWEN3_8B)
    t = time.perf_counter()
    if args.model:
        run.folder = Path(args.model)
    else:
        folder = Path(args.checkpoint) if args.checkpoint else Path(tempfile.mkdtemp(prefix="pacore_e2e_")) / "qwen3"
        run.folder = checkpoint_folder(folder, run.shape, run.dtype, run.device)
    run.save("checkpoint", dict(write_s=time.perf_counter() - t, folder=str(run.folder)))
    status = 0
    for name in SECTIONS:
        if name not in args.only.split(","):
            continue
        run.memory(f"{name} start")
        try:
            globals()[f"section_{name}"](run)
        except Exception as e:  # one failing section must not cost the others' numbers
            status = 1
            run.save(f"{name}_error", f"{type(e).__name__}: {e}"[:1000])
        run.free()  # what a failed section held too (its traceback is gone by now)
        run.memory(f"{name} end")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
