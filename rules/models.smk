# Model acquisition (hub download or synthesised shape) and GPTQ INT4 quantization.


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
        gpu=1,
    log:
        "results/logs/quantize/{model}/{variant}.log",
    conda:
        "../envs/quantize.yaml"
    script:
        "../workflow_scripts/quantize.py"
