from speedsplit import bench


def test_prompts_differ_between_cells_and_runs_and_match_across_stacks(tiny_model):
    wide, narrow = {"cell": "u8-wide-greedy", "seed": 0}, {"cell": "u2-narrow-greedy", "seed": 0}
    seeds = {bench.prompt_seed(c, r) for c in (wide, narrow) for r in (0, 1)}
    assert len(seeds) == 4
    a = bench.build_prompts(tiny_model, 8, 32, bench.prompt_seed(wide, 0))
    b = bench.build_prompts(tiny_model, 8, 32, bench.prompt_seed(wide, 1))
    again = bench.build_prompts(tiny_model, 8, 32, bench.prompt_seed(wide, 0))
    assert a == again  # every stack of a chain gets the same prompts
    assert not set(a) & set(b) and len(set(a)) == 8


def test_honesty_flags():
    from records import fake_result

    from speedsplit.record import EngineFacts

    result = fake_result("vllm-marlin", 8, 0, 100.0)
    result.summary.failed, result.summary.wrong_output_length, result.summary.wall_s = 1, 2, 0.5
    result.engine = EngineFacts(linear_kernel="MacheteLinearKernel")
    flags = bench.honesty_flags(result, {"expect_kernel": "Marlin"}, {"min_measured_s": 1.0})
    assert flags == ["request_failures", "output_length_mismatch", "short_measurement", "kernel_mismatch"]
    assert result.kernel_ok is False
    ok = fake_result("vllm-marlin", 8, 0, 100.0)
    ok.engine = EngineFacts(linear_kernel="MarlinLinearKernel")
    assert bench.honesty_flags(ok, {"expect_kernel": "Marlin"}, {"min_measured_s": 1.0}) == []
    assert ok.kernel_ok is True
