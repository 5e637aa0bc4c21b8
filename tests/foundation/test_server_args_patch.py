"""The launch-time validation hook on real SGLang ServerArgs (built on CPU; 0.5.17, or 0.5.23 with
``make test-sglang-0.5.23``)."""

from types import SimpleNamespace

import pytest

from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.patches import launch_check_patches, apply, unapply_all
from sglang_replayssm.patches.server_args import UnsupportedConfigError, unsupported_reasons
from sglang_replayssm import models


@pytest.fixture
def args_for(tmp_path, monkeypatch):
    from sglang.srt.server_args import prepare_server_args

    path = models.materialize("tiny-qwen3-next", root=tmp_path)

    def make(*extra):
        args = prepare_server_args(["--model-path", path, "--load-format", "dummy", "--skip-tokenizer-init",
                                    "--device", "cpu", "--disable-radix-cache", *extra])
        if hasattr(args, "resolve_once"):  # 0.5.23: the engine resolves the record before check_server_args
            args.resolve_once()
        return args

    yield make
    unapply_all()


def test_supported_args_pass_and_unsupported_are_listed(args_for, monkeypatch):
    monkeypatch.setenv("SGLANG_REPLAYSSM_ENABLE", "1")
    apply(launch_check_patches())
    ok = args_for()
    ok.check_server_args()  # accepted
    args_for("--tp-size", "2").check_server_args()  # tensor parallelism: accepted (per-rank rings)
    bad = args_for("--pp-size", "2", "--disable-overlap-schedule")  # SGLang itself refuses PP with overlap
    with pytest.raises(UnsupportedConfigError) as e:
        bad.check_server_args()
    assert "--pp-size 2" in str(e.value)


def test_tree_spec_accepted_unless_it_cannot_hold_its_nodes(args_for, monkeypatch):
    monkeypatch.setenv("SGLANG_REPLAYSSM_ENABLE", "1")
    apply(launch_check_patches())
    args_for("--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "2",
             "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "8").check_server_args()
    a = args_for("--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "2",
                 "--speculative-num-steps", "1", "--speculative-num-draft-tokens", "8")
    with pytest.raises(UnsupportedConfigError, match="has at most 3 nodes"):
        a.check_server_args()


def test_hook_is_inert_when_disabled(args_for, monkeypatch):
    monkeypatch.delenv("SGLANG_REPLAYSSM_ENABLE", raising=False)
    apply(launch_check_patches())
    args_for("--pp-size", "2", "--disable-overlap-schedule").check_server_args()  # stock behaviour: accepted


def test_reasons_cover_each_combination(args_for):
    a = args_for()
    cfg = ReplaySSMConfig(enable=True, buffer_len=2, extra_buffer=False)   # the cases below include extra_buffer
    assert unsupported_reasons(a, cfg) == []
    cases = {
        "enable_linear_replayssm": (True, "--enable-linear-replayssm"),
        "disaggregation_mode": ("prefill", "PD disaggregation"),
        "enable_hierarchical_cache": (True, "hierarchical"),
        "mamba_radix_cache_strategy": ("extra_buffer", "extra_buffer"),
        "pp_size": (2, "PP=1"),
        "enable_mixed_chunk": (True, "--enable-mixed-chunk"),
        "enable_int8_mamba_checkpoint": (True, "--enable-int8-mamba-checkpoint"),
        "enable_streaming_session": (True, "--enable-streaming-session"),
    }
    # resolved ServerArgs are read-only: vary a plain copy of their fields (0.5.23: a msgspec Struct)
    fields = getattr(type(a), "__struct_fields__", None)
    base = {f: getattr(a, f) for f in fields} if fields else dict(vars(a))
    for field, (value, needle) in cases.items():
        assert field in base, field
        reasons = unsupported_reasons(SimpleNamespace(**{**base, field: value}), cfg)
        assert len(reasons) == 1 and needle in reasons[0], (field, reasons)
    spec = SimpleNamespace(**{**base, "speculative_algorithm": "NEXTN", "speculative_eagle_topk": 1,
                              "speculative_num_draft_tokens": 4})
    assert any("smaller than --speculative-num-draft-tokens" in r for r in unsupported_reasons(spec, cfg))
    assert unsupported_reasons(spec, ReplaySSMConfig(enable=True, buffer_len=4)) == []
    adaptive = SimpleNamespace(**{**vars(spec), "max_speculative_num_draft_tokens": 6})
    assert any("--max-speculative-num-draft-tokens 6" in r
               for r in unsupported_reasons(adaptive, ReplaySSMConfig(enable=True, buffer_len=4)))
    lazy = SimpleNamespace(**{**base, "mamba_radix_cache_strategy": "extra_buffer_lazy"})
    assert any("extra_buffer_lazy" in r for r in unsupported_reasons(lazy, cfg))
    # extra_buffer prefix caching: on by default (--replayssm-extra-buffer false refuses it), with speculative
    # decoding on the ring verifier only
    opted = ReplaySSMConfig(enable=True, buffer_len=4)
    assert opted.extra_buffer is True
    eb = SimpleNamespace(**{**base, "mamba_radix_cache_strategy": "extra_buffer"})
    assert "--replayssm-extra-buffer false" in unsupported_reasons(eb, cfg)[0]
    assert unsupported_reasons(eb, opted) == [] and unsupported_reasons(lazy, opted) == []
    eb_spec = SimpleNamespace(**{**vars(spec), "mamba_radix_cache_strategy": "extra_buffer"})
    reasons = unsupported_reasons(eb_spec, cfg.replace(buffer_len=4))
    assert len(reasons) == 1 and "--replayssm-extra-buffer false" in reasons[0]
    assert unsupported_reasons(eb_spec, opted) == []
    reasons = unsupported_reasons(eb_spec, opted.replace(spec=False))
    assert len(reasons) == 1 and "--replayssm-spec false" in reasons[0] and "no_buffer" in reasons[0]
    ngram = SimpleNamespace(**{**vars(spec), "speculative_algorithm": "NGRAM"})
    assert any("NGRAM" in r for r in unsupported_reasons(ngram, ReplaySSMConfig(enable=True, buffer_len=4)))
    assert unsupported_reasons(ngram, ReplaySSMConfig(enable=True, buffer_len=4, spec=False)) == []


def test_tree_tracking_needs_sglangs_step_index_function(args_for, monkeypatch):
    """Tree drafts with extra_buffer need SGLang's spec_utils._verify_commit_step_indices (0.5.17+; 0.5.15
    computes the step inline): without it the launch is refused in one line naming the flags, instead of the
    first tracked commit failing."""
    from sglang.srt.speculative import spec_utils

    from sglang_replayssm.patches import server_args

    a = args_for()
    fields = getattr(type(a), "__struct_fields__", None)
    base = {f: getattr(a, f) for f in fields} if fields else dict(vars(a))
    tree = SimpleNamespace(**{**base, "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2,
                              "speculative_num_steps": 3, "speculative_num_draft_tokens": 4,
                              "mamba_radix_cache_strategy": "extra_buffer"})
    cfg = ReplaySSMConfig(enable=True, buffer_len=4)
    assert server_args.tree_tracking_available()
    assert not any("_verify_commit_step_indices" in r for r in unsupported_reasons(tree, cfg))
    monkeypatch.delattr(spec_utils, "_verify_commit_step_indices")
    reasons = [r for r in unsupported_reasons(tree, cfg) if "_verify_commit_step_indices" in r]
    assert len(reasons) == 1 and "--speculative-eagle-topk 1" in reasons[0] and "no_buffer" in reasons[0]
    chain = SimpleNamespace(**{**vars(tree), "speculative_eagle_topk": 1, "speculative_num_steps": 3})
    assert not any("_verify_commit_step_indices" in r for r in unsupported_reasons(chain, cfg))
