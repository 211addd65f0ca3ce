# Model acquisition (hub download, local folder or synthesised shape), INT4 quantization
# (GPTQ, AWQ) and llama.cpp's GGUF conversion.


rule model:
    output:
        directory("resources/models/{model}/fp16"),
    params:
        entry=model_entry,
        platform=PLATFORM,
    resources:
        gpu=1,
    log:
        "results/logs/model/{model}.log",
    conda:
        "../envs/model.yaml"
    script:
        "../workflow_scripts/model.py"


rule quantize:
    input:
        fp16="resources/models/{model}/fp16",
    output:
        model=directory("resources/models/{model}/{variant}"),
        report=ss_plan.QUANTIZE_REPORT,
    wildcard_constraints:
        variant=r"(gptq|awq)-w\d+g(\d+|pc)",
    params:
        settings=quantize_settings,
        platform=PLATFORM,
    resources:
        gpu=quantize_gpus,
    log:
        "results/logs/quantize/{model}/{variant}.log",
    conda:
        "../envs/quantize.yaml"
    script:
        "../workflow_scripts/quantize.py"


# llama.cpp's own format (the gguf stacks): the FP16 weights through llama.cpp's converter.
rule gguf:
    input:
        fp16="resources/models/{model}/fp16",
    output:
        model=directory("resources/models/{model}/gguf-{gguf_type}"),
    wildcard_constraints:
        gguf_type=r"f16|bf16|q8_0",
    log:
        "results/logs/gguf/{model}/{gguf_type}.log",
    conda:
        "../envs/model.yaml"
    script:
        "../workflow_scripts/gguf.py"
