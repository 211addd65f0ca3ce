# Prompt logprobs under draft-model speculative decoding, against the main and the draft model's own.
import json, math, os, sys, torch
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
def run():
    root = "/tmp/speculative/resources/models"
    main, draft = f"{root}/small/fp16", f"{root}/small-draft/fp16"
    from transformers import AutoTokenizer, AutoModelForCausalLM
    tok = AutoTokenizer.from_pretrained(main)
    text = open(f"{main}/speedsplit-heldout.txt").read()[:4000] if os.path.exists(f"{main}/speedsplit-heldout.txt") else open("/usr/lib/python3.12/os.py").read()[:4000]
    ids = tok(text)["input_ids"][:256]
    out = {}
    from vllm import LLM, SamplingParams
    for name, spec in (("vllm_draft", {"model": draft, "num_speculative_tokens": 3}), ("vllm_plain", None)):
        llm = LLM(model=main, speculative_config=spec, gpu_memory_utilization=0.3, max_model_len=2048, enforce_eager=True)
        r = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=0, logprobs=0))[0]
        pl = r.prompt_logprobs
        nll = -sum(pl[i][ids[i]].logprob for i in range(1, len(ids))) / (len(ids) - 1)
        out[name] = math.exp(nll)
        out[name + "_first"] = [round(pl[i][ids[i]].logprob, 3) for i in range(1, 6)]
        out[name + "_gen"] = [list(d.items())[0][1].logprob for d in r.outputs[0].logprobs]
        print(json.dumps(out), flush=True)
        del llm; import gc; gc.collect(); torch.cuda.empty_cache()
    for name, path in (("main", main), ("draft", draft)):
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float16).cuda().eval()
        with torch.no_grad():
            lp = torch.log_softmax(m(torch.tensor([ids]).cuda()).logits.float(), -1)[0]
        nll = -sum(lp[i - 1, ids[i]].item() for i in range(1, len(ids))) / (len(ids) - 1)
        out[f"hf_{name}"] = math.exp(nll); del m; torch.cuda.empty_cache()
    print("RESULT", json.dumps(out))
if __name__ == "__main__":
    run()
