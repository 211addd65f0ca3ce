"""Model weights: fetching or synthesising a checkpoint, its identity and tokenizer
(checkpoint), and GPTQ quantization through GPTQModel (quantize)."""
