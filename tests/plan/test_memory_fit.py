"""The memory-fit arithmetic (llmgw.core.weights.memory_fit): golden numbers for a 7B and a 70B shape (as their
config.json and safetensors headers give them) against 24 GB and 80 GB cards, and properties that hold for
every shape: more parallelism never needs more per GPU, the KV cache is linear in context and sequences, more
memory never turns a fit into a misfit, and an unknown field is never a pass."""

from __future__ import annotations

from hypothesis import given, strategies as st

from llmgw.core.weights.memory_fit import GIB, RUNTIME_OVERHEAD, memory_fit
from llmgw.core.weights.model_headers import ModelShape

# Mistral-7B-like (GQA: 8 KV heads of 32) and Llama-70B-like, bf16: what their headers say.
SEVEN_B = ModelShape(
    format="safetensors",
    layers=32,
    kv_heads=8,
    attention_heads=32,
    head_dim=128,
    dtype="BF16",
    parameters=7_241_732_096,
    tensor_bytes=14_483_464_192,
    trained_context=32768,
)
SEVENTY_B = ModelShape(
    format="safetensors",
    layers=80,
    kv_heads=8,
    attention_heads=64,
    head_dim=128,
    dtype="BF16",
    parameters=70_553_706_496,
    tensor_bytes=141_107_412_992,
    trained_context=131072,
)
GB24, GB80 = 24 * GIB, 80 * GIB


def test_a_7b_fits_one_24gb_card_with_the_numbers() -> None:
    fit = memory_fit(SEVEN_B, tp=1, pp=1, context_length=32768, gpu_memory=GB24)
    assert fit.weights == SEVEN_B.tensor_bytes
    assert fit.kv_cache == 2 * 32 * 8 * 128 * 2 * 32768  # 4 GiB: K and V, every layer, 8 KV heads
    assert fit.fits is True
    assert fit.words() == (
        "fits per GPU (1 GPU): weights 13.5 GiB + KV cache 4.0 GiB (1 sequence x 32768 tokens) + overhead "
        "1.0 GiB = 18.5 GiB of 21.6 GiB usable (24.0 GiB x 0.90); headroom 3.1 GiB"
    )
    # Sixteen full-context sequences do not: the cache alone is 64 GiB.
    assert memory_fit(SEVEN_B, tp=1, pp=1, context_length=32768, gpu_memory=GB24, slots=16).fits is False


def test_a_70b_needs_tp_4_on_80gb_and_cannot_fit_24gb_at_tp_4() -> None:
    def on(gpu: int, tp: int) -> bool | None:
        return memory_fit(SEVENTY_B, tp=tp, pp=1, context_length=8192, gpu_memory=gpu, slots=8).fits

    assert [on(GB80, tp) for tp in (1, 2, 4)] == [False, False, True]
    four = memory_fit(SEVENTY_B, tp=4, pp=1, context_length=8192, gpu_memory=GB80, slots=8)
    assert four.weights == SEVENTY_B.tensor_bytes // 4
    assert four.kv_cache == 2 * 80 * 2 * 128 * 2 * 8192 * 8  # 8 KV heads over 4 GPUs: 2 each
    assert on(GB24, 4) is False
    words = memory_fit(SEVENTY_B, tp=4, pp=1, context_length=8192, gpu_memory=GB24, slots=8).words()
    assert words.startswith("does not fit per GPU (4 GPUs): weights 32.9 GiB + KV cache 5.0 GiB")


def test_unknown_fields_are_not_a_pass() -> None:
    fit = memory_fit(
        ModelShape(format="gguf", tensor_bytes=GIB), tp=1, pp=1, context_length=4096, gpu_memory=GB24
    )
    assert fit.fits is None and fit.kv_cache is None
    assert fit.words() == "not computed: the model's headers do not give layers, KV heads, head size"


shapes = st.builds(
    ModelShape,
    format=st.just("safetensors"),
    layers=st.integers(1, 160),
    kv_heads=st.integers(1, 128),
    head_dim=st.sampled_from([64, 80, 96, 128, 256]),
    dtype=st.sampled_from(["BF16", "F16", "F32", "F8_E4M3"]),
    tensor_bytes=st.integers(1, 1 << 42),
)
sizes = st.sampled_from([1, 2, 4, 8])


@given(shapes, sizes, sizes, st.integers(1, 1 << 17), st.integers(1, 64))
def test_more_parallelism_never_needs_more_per_gpu(
    shape: ModelShape, tp: int, pp: int, ctx: int, slots: int
) -> None:
    base = memory_fit(shape, tp=tp, pp=pp, context_length=ctx, gpu_memory=GB80, slots=slots)
    for more in (
        memory_fit(shape, tp=tp * 2, pp=pp, context_length=ctx, gpu_memory=GB80, slots=slots),
        memory_fit(shape, tp=tp, pp=pp * 2, context_length=ctx, gpu_memory=GB80, slots=slots),
    ):
        assert more.needed is not None and base.needed is not None
        assert more.needed <= base.needed
        assert more.weights is not None and base.weights is not None and more.weights <= base.weights


@given(shapes, sizes, st.integers(1, 1 << 16), st.integers(1, 32))
def test_the_kv_cache_is_linear_in_context_and_sequences(
    shape: ModelShape, tp: int, ctx: int, slots: int
) -> None:
    one = memory_fit(shape, tp=tp, pp=1, context_length=ctx, gpu_memory=GB80, slots=1).kv_cache
    assert one is not None
    assert (
        memory_fit(shape, tp=tp, pp=1, context_length=ctx, gpu_memory=GB80, slots=slots).kv_cache
        == one * slots
    )
    assert (
        memory_fit(shape, tp=tp, pp=1, context_length=2 * ctx, gpu_memory=GB80, slots=1).kv_cache == 2 * one
    )


@given(shapes, sizes, st.integers(1, 1 << 16), st.integers(1, 1 << 40), st.integers(1, 1 << 40))
def test_more_memory_never_turns_a_fit_into_a_misfit(
    shape: ModelShape, tp: int, ctx: int, a: int, b: int
) -> None:
    small, large = sorted((a, b))
    fit_small = memory_fit(shape, tp=tp, pp=1, context_length=ctx, gpu_memory=small)
    fit_large = memory_fit(shape, tp=tp, pp=1, context_length=ctx, gpu_memory=large)
    assert not (fit_small.fits and not fit_large.fits)
    assert fit_small.needed == fit_large.needed and fit_small.overhead == RUNTIME_OVERHEAD
