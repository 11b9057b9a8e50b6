"""config.json parsing: the defaults and layer plans transformers applies, without torch
(docs/model.md#supported-checkpoints-and-configuration)."""

from __future__ import annotations

import pytest

from onnx_hybrid.exporter import ExportError
from onnx_hybrid.exporter.model_config import FULL, LINEAR, parse_model_config

TEXT = {"vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 32, "intermediate_size": 96}
MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40}


def test_layer_types_default_to_every_fourth_attention_and_rope_defaults():
    cfg = parse_model_config({"architectures": ["Qwen3_5ForCausalLM"], **TEXT})
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 2
    assert (cfg.rotary_dim, cfg.rope_theta) == (8, 10000.0)  # partial_rotary_factor 0.25 by default
    assert not any(cfg.moe_layers)


def test_multimodal_wrapper_reads_text_config_and_mrope_collapses():
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5, "mrope_section": [4, 2, 2]}
    cfg = parse_model_config({"architectures": ["Qwen3_5ForConditionalGeneration"],
                              "text_config": {**TEXT, "rope_parameters": rope, "full_attention_interval": 2},
                              "tie_word_embeddings": True})
    assert cfg.multimodal and cfg.tie_word_embeddings
    assert cfg.layer_types == (LINEAR, FULL) * 4
    assert (cfg.rotary_dim, cfg.rope_theta) == (16, 1e7)
    legacy = parse_model_config({"architectures": ["Qwen3_5ForCausalLM"], **TEXT,
                                 "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}})
    assert legacy.rotary_dim == 8


def test_qwen3_next_moe_plan_and_routing():
    cfg = parse_model_config({"architectures": ["Qwen3NextForCausalLM"], **TEXT, **MOE,
                              "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": False})
    assert cfg.moe_layers == (False, True, False, False, False, True, False, True)
    assert not cfg.moe.renormalize
    moe35 = parse_model_config({"architectures": ["Qwen3_5MoeForCausalLM"], **TEXT, **MOE, "norm_topk_prob": False})
    assert all(moe35.moe_layers) and moe35.moe.renormalize  # qwen3_5_moe always renormalises


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["Qwen3ForCausalLM"]}, "supported: Qwen3_5ForCausalLM"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope_type 'yarn'"),
    ({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
    ({"layer_types": ["linear_attention"] * 3}, "layer_types must list 8 entries"),
])
def test_bad_configs_fail_early_with_a_message(change, message):
    with pytest.raises(ExportError, match=message):
        parse_model_config({"architectures": ["Qwen3_5ForCausalLM"], **TEXT, **change})
