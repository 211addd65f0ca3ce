cd /tmp/speculative
M=resources/models
PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 setsid python3 -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port 8123 \
  --model $M/small/fp16 --dtype float16 --max-model-len 2048 --served-model-name small \
  --speculative-config "{\"model\": \"$M/small-draft/fp16\", \"num_speculative_tokens\": 3}" > /tmp/srv.log 2>&1 &
for i in $(seq 150); do curl -sf 127.0.0.1:8123/health >/dev/null && break; sleep 1; done; echo "ready after $i s"
PYTHONPATH=/tmp/site python3 - <<'PY'
import json, math, urllib.request, concurrent.futures as cf
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained("resources/models/small/fp16")
text = open("/usr/lib/python3.12/os.py").read()
def ask(k):
    ids = tok(text[k*3000:k*3000+4000])["input_ids"][:256]
    body = {"model": "small", "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    r = json.load(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8123/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})))
    lp = r["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)]
    return round(math.exp(-sum(lp) / len(lp)), 3)
print("single", [ask(k) for k in range(3)])
with cf.ThreadPoolExecutor(8) as ex: print("8 at once", list(ex.map(ask, range(8))))
print("single again", [ask(k) for k in range(3)])
PY
pkill -f "port 8123"; grep -m2 -i "error" /tmp/srv.log
