"""A decode step split into kernel classes, on traces whose answer is known: kernel names as
vLLM 0.26 runs them on Hopper, and a CPU build's nested ops."""

import pytest

from speedsplit.core.trace_split import CLASSES, ProfileRecord, ProfileWindow, classify, split_trace

# (kernel name as the trace names it, class it belongs to)
HOPPER = [
    ("nvjet_tst_192x8_64x8_2x1_v_bz_splitK_TNT", "dense_gemm"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "dense_gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, __half, __half>", "dense_gemm"),
    ("void marlin::Marlin<(vllm::ScalarTypeId)5, 256, 1, 8, 8, 8, 4, false, true>", "quantized_gemm"),
    ("void cutlass::device_kernel<machete::MacheteKernelTemplate<cute::tuple<int, int>>>", "quantized_gemm"),
    ("void cutlass::device_kernel<vllm::cutlass_3x_gemm_sm90_fp8<cutlass::float_e4m3_t>>", "quantized_gemm"),
    ("void vllm::dynamic_per_token_scaled_fp8_quant_kernel<c10::Half, c10::Float8_e4m3fn>", "quantized_gemm"),
    ("void vllm::gptq::gemm_half_q_half_gptq_4bit_kernel<true, 1>", "quantized_gemm"),
    ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128>>", "attention"),
    ("void vllm::reshape_and_cache_flash_kernel<__half, __half, (vllm::Fp8KVCacheDataType)0>", "attention"),
    ("ncclDevKernel_AllReduce_Sum_f16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void vllm::cross_device_reduce_1stage<__half, 2>", "communication"),
    ("void vllm::rms_norm_kernel<c10::Half, 8>", "other"),
    ("void vllm::act_and_mul_kernel<c10::Half, &vllm::silu_kernel<c10::Half>, true>", "other"),
    ("void vllm::rotary_embedding_kernel<c10::Half, true>", "other"),
    # as one H100 ran them (docs/evidence/h100-2026-12-06-why): cuBLAS, FlashAttention 3, Machete
    # and FP8 scaled-mm in CUTLASS, Inductor's fused kernels (named after the ops they fuse)
    ("nvjet_sm90_hsh_224x64_64x5_2x1_v_bz_TNN", "dense_gemm"),
    ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<>>>", "attention"),
    (
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
        "machete::MacheteCollectiveMma<>>>",
        "quantized_gemm",
    ),
    (
        "triton_red_fused__to_copy_abs_clamp_cutlass_scaled_mm_div_max_mul_reciprocal_silu_slice_unsqueeze_2",
        "quantized_gemm",
    ),
    ("triton_red_fused__to_copy_embedding_rms_norm_0", "other"),
    ("triton_poi_fused_mul_silu_slice_1", "other"),
    ("_gumbel_sample_kernel", "other"),
    (
        "void at::native::elementwise_kernel<128, 4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
        "copy",
    ),
    # vLLM's CPU build
    ("_C::cpu_gemm_wna16", "quantized_gemm"),
    ("aten::_weight_int4pack_mm_for_cpu", "quantized_gemm"),
    ("aten::linear", "dense_gemm"),
    ("aten::addmm", "dense_gemm"),
    ("_C::paged_attention_v1", "attention"),
    ("vllm::unified_attention_with_output", "attention"),
    ("vllm::unified_kv_cache_update", "attention"),
    ("_C::int4_scaled_mm_cpu", "quantized_gemm"),
    ("_C::weight_packed_linear", "dense_gemm"),
    ("aten::to", "copy"),
    ("aten::silu", "other"),
]


@pytest.mark.parametrize("name,cls", HOPPER)
def test_every_kernel_of_a_hopper_decode_step_has_its_class(name, cls):
    assert classify(name) == cls


def k(name, ts, dur, cat="kernel", tid=7):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def test_a_decode_step_splits_into_classes_that_add_up_to_it():
    # four steps over 0..4000 µs, each: dense GEMM 200, Marlin 300, attention 150 (of which 50
    # overlap Marlin on another stream: attention, first in order, keeps them), a norm 50, a
    # copy 40 (10 of it over the norm: the copy, before other kernels in order, keeps them),
    # idle the rest
    events = []
    for i in range(4):
        t = 1000 * i
        events += [
            k("nvjet_tst_128x64_64x8_1x1_v_bz_coopB_TNN", t, 200),
            k("void marlin::Marlin<256, 1>", t + 200, 300),
            k("void flash::flash_fwd_splitkv_kernel<>", t + 450, 150, tid=8),
            k("void vllm::rms_norm_kernel<c10::Half, 8>", t + 600, 50),
            k("Memcpy HtoD (Pinned -> Device)", t + 640, 40, cat="gpu_memcpy"),
        ]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000})  # host side: not a kernel
    s = split_trace(events, steps=4)
    ms = 1e-3
    assert s.device == "gpu" and s.step_ms == pytest.approx((3680) / 4 * ms)
    assert s.dense_gemm_ms == pytest.approx(200 * ms)
    assert s.quantized_gemm_ms == pytest.approx(250 * ms)
    assert s.attention_ms == pytest.approx(150 * ms)
    assert s.other_ms == pytest.approx(40 * ms)
    assert s.copy_ms == pytest.approx(40 * ms)
    assert s.steps == 4 and s.prefill_steps is None  # no step annotations: the window's iterations
    # the window ends with the last step's copy: 3 gaps of 1000 - 680 µs in 3680 µs
    assert s.idle_ms == pytest.approx(3 * 320 / 4 * ms)
    assert sum(getattr(s, f"{c}_ms") for c in CLASSES) == pytest.approx(s.step_ms)
    assert s.top["quantized_gemm"] == [("void marlin::Marlin<256, 1>", pytest.approx(300 * ms))]


def test_a_cpu_trace_splits_its_nested_ops():
    # one step of 1000 µs: a linear (dense) holding an int4 matmul 100-400 (quantized), an
    # attention op 500-700 holding a copy_ (attention), a silu 750-800, a to() 950-1000 (a
    # copy); vLLM annotated two steps, one of them with prefill
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "execute_context_1(32)_generation_3(3)", "ts": 0, "dur": 500},
        {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_4(4)", "ts": 500, "dur": 500},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "execute_context_0(0)_generation_4(4)", "ts": 0, "dur": 1},
        k("aten::linear", 0, 450, cat="cpu_op"),
        k("aten::_weight_int4pack_mm_for_cpu", 100, 300, cat="cpu_op"),
        k("vllm::unified_attention_with_output", 500, 200, cat="cpu_op"),
        k("aten::copy_", 550, 50, cat="cpu_op"),
        k("aten::silu", 750, 50, cat="cpu_op"),
        k("aten::to", 950, 50, cat="cpu_op"),
        k("_C::weight_packed_linear", 850, 50, cat="cpu_op"),
    ]
    s = split_trace(events, steps=8)
    assert s.device == "cpu" and s.steps == 2 and s.prefill_steps == 1 and s.step_ms == pytest.approx(0.5)
    assert (s.quantized_gemm_ms, s.dense_gemm_ms, s.attention_ms) == pytest.approx((0.15, 0.1, 0.1))
    assert (s.other_ms, s.copy_ms, s.idle_ms) == pytest.approx((0.025, 0.025, 0.1))


def test_a_record_gives_its_ranks_mean():
    a = split_trace([k("nvjet_gemm", 0, 100), k("ncclAllReduce", 100, 100)], 1)
    b = split_trace([k("nvjet_gemm", 0, 300), k("ncclAllReduce", 300, 100)], 1)
    rec = ProfileRecord(status="ok", window=ProfileWindow(), ranks=[a, b])
    assert rec.split.dense_gemm_ms == pytest.approx(0.2) and rec.split.communication_ms == pytest.approx(0.1)
    assert ProfileRecord.model_validate_json(rec.model_dump_json()).split == rec.split
    assert ProfileRecord(status="error", window=ProfileWindow(), error="x").split is None


def test_the_window_arms_a_server_through_the_argument_templates():
    from speedsplit.serving.stacks import render_args

    args = render_args(ProfileWindow(delay_iterations=4, iterations=8).server_args("/t"), {})
    assert args[0] == "--profiler-config" and '"delay_iterations": 4' in args[1] and '"max_iterations": 8' in args[1]
