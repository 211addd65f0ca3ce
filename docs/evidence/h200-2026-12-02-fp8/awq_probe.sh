# On the host, after the bundle is installed (speedsplit host install) (run as `awq_probe.sh SECONDS`): the 8B shape synthesised, then GPTQModel's AWQ as the
# quantize rule runs it now (16 sequences per forward pass, vectorised packer), its log read
# after a fixed time.
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1
S=$SECONDS
python3 -c "from speedsplit.models.checkpoint import synthesize; synthesize('llama-3.1-8b', '/tmp/m8b')" > /tmp/synth.log 2>&1
echo "synthesised in $((SECONDS - S)) s"
setsid nohup python3 -c "from speedsplit.models.quantize import quantize; print(quantize('/tmp/m8b', '/tmp/awq8b', fmt='awq', calibration_samples=128, calibration_tokens=512, eval_samples=8))" > /tmp/awq.log 2>&1 < /dev/null &
sleep "$1"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tr '\r' '\n' < /tmp/awq.log | grep "Quantizing layer" | sed -E 's/.*Quantizing layer ([0-9]+) of 31.*\| ([0-9:]+) \/.*/\1 \2/' | sort -u -k1,1n | awk '!seen[$1]++' | tr '\n' ';'; echo
tail -c 400 /tmp/awq.log | tr '\r' '\n' | tail -2
gzip -c /tmp/awq.log > "$OUT/awq-batched.log.gz"
