"""Parameter counts of the catalog models against their officially published figures.

Every expected figure below is copied from the cited document, never from this code's output.
A published figure is only as precise as it is printed: "37B" says 36.5B <= N < 37.5B. So a count
passes when it is within 0.5 % of the figure or within half a unit of its last printed digit,
whichever is looser (for "671B" that is 0.5 %; for "37B" it is 0.5B).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from gpufleet.catalog.records import MLASpec, ModelSpec, MoESpec
from gpufleet.catalog.registry import Catalog
from gpufleet.workload.params import ParamCount, attention_params, count_params

RELATIVE_TOLERANCE = 0.005


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog()


def allowed_error(printed_billions: str) -> float:
    """Absolute tolerance, in parameters, for a figure printed as `printed_billions` (e.g. '12.9')."""
    figure = Decimal(printed_billions)
    exponent = figure.as_tuple().exponent
    assert isinstance(exponent, int)
    half_unit = float(Decimal(5) * Decimal(10) ** (exponent - 1)) * 1e9
    return max(RELATIVE_TOLERANCE * float(figure) * 1e9, half_unit)


def _total(p: ParamCount) -> int:
    return p.total


def _active(p: ParamCount) -> int:
    return p.active


def _active_without_embedding(p: ParamCount) -> int:
    # DeepSeek counts activated parameters without the input embedding table (a lookup, no FLOPs):
    # DeepSeek-V2-Lite's "2.4B active" is likewise ~0.2B (its embedding) below the full count
    # (deepseek-ai/DeepSeek-V2#73).
    return p.active - p.embedding


def _without_embedding_tables(p: ParamCount) -> int:
    # Qwen's and NVIDIA's "non-embedding" excludes both the input table and the output projection.
    # `output` also holds the final norm (a few thousand parameters, far below the printed precision).
    return p.total - p.embedding - p.output


COUNTS = {
    "total": _total,
    "active": _active,
    "active_without_embedding": _active_without_embedding,
    "without_embedding_tables": _without_embedding_tables,
}


@dataclass(frozen=True)
class Published:
    model: str
    count: str  # a key of COUNTS
    billions: str  # as printed in the source
    citation: str


PUBLISHED = [
    Published("llama3-8b", "total", "8.03", "Hugging Face meta-llama/Llama-3.1-8B model page: 8.03B params"),
    Published("llama3-70b", "total", "70.6",
              "Hugging Face meta-llama/Llama-3.1-70B model page: 70.6B params"),
    Published("llama3-405b", "total", "406",
              "Hugging Face meta-llama/Llama-3.1-405B model page: 406B params"),
    Published("llama2-7b", "total", "6.74", "Hugging Face meta-llama/Llama-2-7b-hf model page: 6.74B params"),
    Published("llama2-13b", "total", "13.0", "Hugging Face meta-llama/Llama-2-13b-hf model page: 13B params"),
    Published("llama2-70b", "total", "69.0", "Hugging Face meta-llama/Llama-2-70b-hf model page: 69B params"),
    Published("gpt3-175b", "total", "175.0", "Brown et al. 2020 (arXiv 2005.14165) Table 2.1: 175.0B"),
    Published("mixtral-8x7b", "total", "46.7", "Mistral AI blog 'Mixtral of experts' (2023-12): 46.7B total"),
    Published("mixtral-8x7b", "active", "12.9",
              "Mistral AI blog 'Mixtral of experts' (2023-12): 12.9B per token"),
    Published("mixtral-8x22b", "total", "141",
              "Mistral AI blog 'Cheaper, Better, Faster, Stronger' (2024-04): 141B"),
    Published("mixtral-8x22b", "active", "39",
              "Mistral AI blog 'Cheaper, Better, Faster, Stronger' (2024-04): 39B active"),
    Published("deepseek-v3", "total", "671", "DeepSeek-V3 Technical Report (arXiv 2412.19437): 671B total"),
    Published("deepseek-v3", "active_without_embedding", "37",
              "DeepSeek-V3 Technical Report (arXiv 2412.19437): 37B activated for each token"),
    Published("qwen3-30b-a3b", "total", "30.5", "Qwen/Qwen3-30B-A3B model card: 30.5B in total"),
    Published("qwen3-30b-a3b", "without_embedding_tables", "29.9",
              "Qwen/Qwen3-30B-A3B model card: 29.9B non-embedding"),
    Published("qwen3-235b-a22b", "total", "235", "Qwen/Qwen3-235B-A22B model card: 235B in total"),
    Published("qwen3-235b-a22b", "active", "22", "Qwen/Qwen3-235B-A22B model card: 22B activated"),
    Published("qwen3-235b-a22b", "without_embedding_tables", "234",
              "Qwen/Qwen3-235B-A22B model card: 234B non-embedding"),
    Published("nemotron4-340b", "total", "341.0",
              "Nemotron-4 340B Technical Report (arXiv 2406.11704) Table 1: "
              "9.4B embedding + 331.6B non-embedding"),
    Published("nemotron4-340b", "without_embedding_tables", "331.6",
              "Nemotron-4 340B Technical Report (arXiv 2406.11704) Table 1: 331.6B non-embedding"),
    Published("opt-175b", "total", "175", "Zhang et al. 2022, OPT (arXiv 2205.01068) Table 1: 175B"),
    Published("mt-nlg-530b", "total", "530", "Smith et al. 2022, MT-NLG (arXiv 2201.11990): 530 billion"),
    # Narayanan et al. SC21 (arXiv 2104.04473) Table 1, column 'Number of parameters (billion)'.
    Published("gpt-1.7b", "total", "1.7", "Narayanan et al. SC21 Table 1: 1.7"),
    Published("gpt-3.6b", "total", "3.6", "Narayanan et al. SC21 Table 1: 3.6"),
    Published("gpt-7.5b", "total", "7.5", "Narayanan et al. SC21 Table 1: 7.5"),
    Published("gpt-18b", "total", "18.4", "Narayanan et al. SC21 Table 1: 18.4"),
    Published("gpt-39b", "total", "39.1", "Narayanan et al. SC21 Table 1: 39.1"),
    Published("gpt-76b", "total", "76.1", "Narayanan et al. SC21 Table 1: 76.1"),
    Published("gpt-145b", "total", "145.6", "Narayanan et al. SC21 Table 1: 145.6"),
    Published("gpt-310b", "total", "310.1", "Narayanan et al. SC21 Table 1: 310.1"),
    Published("mt-nlg-530b", "total", "529.6", "Narayanan et al. SC21 Table 1: 529.6"),
    Published("gpt-1t", "total", "1008.0", "Narayanan et al. SC21 Table 1: 1008.0"),
    Published("gpt-22b", "total", "22", "Korthikanti et al. 2022 (arXiv 2205.05198) Table 3: 22B"),
]


@pytest.mark.parametrize("published", PUBLISHED, ids=lambda p: f"{p.model}-{p.count}")
def test_parameter_count_matches_published_figure(catalog: Catalog, published: Published) -> None:
    counted = COUNTS[published.count](count_params(catalog.model(published.model)))
    expected = float(published.billions) * 1e9
    error = counted - expected
    assert abs(error) <= allowed_error(published.billions), (
        f"{published.model} {published.count}: counted {counted:,}, published {published.billions}B "
        f"({published.citation}); error {error / expected:+.3%}"
    )


def test_qwen3_30b_active_is_the_model_cards_figure_truncated(catalog: Catalog) -> None:
    # Qwen/Qwen3-30B-A3B model card: "3.3B activated". Counting every parameter a token touches
    # (attention, 8 of 128 experts, router, norms, both embedding tables) gives 3.35B, which the card
    # truncates rather than rounds: the 0.05B gap is more than the router (12.6M) or the norms.
    active = count_params(catalog.model("qwen3-30b-a3b")).active
    assert 3.3e9 <= active < 3.4e9


# Exact counts printed by their sources (every parameter, including biases and norms).
EXACT = [
    ("mpt-1b", 1_315_950_592),  # mosaicml/llm-foundry scripts/train/benchmarking/README.md @8c8dd48f
    ("mpt-3b", 2_651_837_440),  # same table
    ("mpt-7b", 6_658_859_008),  # same table
    ("mpt-13b", 12_853_954_560),  # same table
    ("mpt-30b", 29_975_214_080),  # same table
    ("mpt-70b", 64_862_437_376),  # same table
]


@pytest.mark.parametrize(("model_id", "printed"), EXACT, ids=[m for m, _ in EXACT])
def test_parameter_count_equals_printed_exact_figure(catalog: Catalog, model_id: str, printed: int) -> None:
    assert count_params(catalog.model(model_id)).total == printed


def test_bloom_count_is_exact_but_for_the_embedding_layernorm(catalog: Catalog) -> None:
    # bigscience/bloom model card: 176,247,271,424 parameters. BLOOM adds a LayerNorm (weight and
    # bias, 2 x 14336) after the word embedding, which ModelSpec has no field for.
    published = 176_247_271_424
    counted = count_params(catalog.model("bloom-176b")).total
    assert published - counted == 2 * 14336


# ------------------------------------------------------------------------------------------------
# Hand-derived checks of the formula on small models
# ------------------------------------------------------------------------------------------------


def _tiny(**fields: object) -> ModelSpec:
    base: dict[str, object] = {
        "id": "tiny",
        "name": "tiny",
        "source": "hand-written test model",
        "layers": 2,
        "hidden": 8,
        "heads": 4,
        "kv_heads": 2,
        "ffn_hidden": 16,
        "gated_mlp": True,
        "vocab": 10,
    }
    base.update(fields)
    return ModelSpec.model_validate(base)


def test_gpt2_small_by_formula() -> None:
    # GPT-2 small (Radford et al. 2019; Hugging Face `gpt2`: 124,439,808 parameters). By hand:
    # per layer: attention 4*h^2 + 4h, MLP 8*h^2 + 5h, two LayerNorms 4h  -> 12*h^2 + 13h
    # embeddings: (vocab + positions) * h, tied output; final LayerNorm 2h.
    h, layers, vocab, positions = 768, 12, 50257, 1024
    by_hand = layers * (12 * h * h + 13 * h) + (vocab + positions) * h + 2 * h
    assert by_hand == 124_439_808
    model = ModelSpec(
        id="gpt2", name="GPT-2 small", source="Radford et al. 2019", layers=layers, hidden=h, heads=12,
        kv_heads=12, ffn_hidden=4 * h, gated_mlp=False, vocab=vocab, tied_embeddings=True,
        linear_bias=True, norm="layernorm", learned_positions=positions,
    )
    assert count_params(model).total == by_hand


def test_tiny_gqa_llama_by_hand() -> None:
    # hidden 8, 4 heads of 2, 2 KV heads: q 8x8=64, k 8x4=32, v 32, o 64 -> 192
    # gated MLP 3 x 8 x 16 = 384; two RMSNorms 16 -> 592 per layer, x2 layers = 1184
    # embedding 10x8 = 80, untied head 80, final norm 8 -> 1352
    params = count_params(_tiny())
    assert params.total == 1352
    assert params.active == 1352
    assert params.embedding == 80


def test_tiny_moe_with_shared_expert_and_leading_dense_layer() -> None:
    # layer 0 dense (ffn 16): 192 + 384 + 16 = 592
    # layer 1 MoE: attention 192 + norms 16 + 4 experts x (3x8x4 = 96) + 1 shared 96 + router 8x4 = 32
    #   = 192 + 16 + 384 + 96 + 32 = 720; active drops 2 of 4 routed experts: 720 - 192 = 528
    model = _tiny(moe=MoESpec(experts=4, top_k=2, shared_experts=1, expert_ffn_hidden=4, dense_layers=1))
    params = count_params(model)
    assert params.per_layer_total == (592, 720)
    assert params.total == 592 + 720 + 80 + 80 + 8
    assert params.active == params.total - 2 * 96


def test_tiny_mla_attention_by_hand() -> None:
    # hidden 8, 4 heads; q_lora 3, kv_lora 2, qk_nope 2, qk_rope 1, v_head 2:
    # q: 8x3 + norm 3 + 3 x 4x(2+1) = 24 + 3 + 36 = 63
    # kv down: 8 x (2+1) + norm 2 = 26; kv up: 2 x 4x(2+2) = 32; out: 4x2 x 8 = 64  -> 185
    mla = MLASpec(q_lora_rank=3, kv_lora_rank=2, qk_nope_head_dim=2, qk_rope_head_dim=1, v_head_dim=2)
    assert attention_params(_tiny(kv_heads=4, mla=mla)) == 185


def test_qk_norm_adds_two_head_dim_vectors_per_layer() -> None:
    plain = count_params(_tiny(head_dim=4)).total
    normed = count_params(_tiny(head_dim=4, qk_norm=True)).total
    assert normed - plain == 2 * (2 * 4)


def test_tied_embeddings_remove_exactly_the_output_table() -> None:
    assert count_params(_tiny()).total - count_params(_tiny(tied_embeddings=True)).total == 10 * 8
