"""The real servers: a stack's command line and start (stacks), cards and ports (lease), the
server sessions that several cells share (session), the host-memory cap (memcap), the stock
generate() server (hf_generate) and the vLLM CPU INT4 plugin (vllm_cpu)."""
