"""A/B harness: stock SGLang vs ``sglang_replayssm`` on real SGLang servers.

One command starts, one after another and with identical SGLang flags,

* ``python -m sglang.launch_server ...``            (arm ``stock``)
* ``python -m sglang_replayssm.launch_server ...``  (arm ``staged``: the replay path, the launcher's default;
  arm ``patched`` adds ``--replayssm-replay-ring false``, the launch checks over SGLang's own kernels)

waits for ``/health``, drives each with SGLang's own ``sglang.bench_serving`` (token-id
prompts: ``--dataset-name random-ids --tokenize-prompt``; one run per batch size with
``--max-concurrency B``), sends the same greedy parity prompts (N generated tokens, top-k
logprobs) to every server, records ``/server_info`` (max running requests, memory, spec
accept length), ``/metrics`` and the GPU's peak memory (``nvidia-smi``), and stops each
server (SIGTERM to its process group, SIGKILL after a grace period), also on failure.

    python -m eval.ab --model nemotron-h-8b --batch 1,32,128,256
    python -m eval.ab --model tiny-nemotron-h --arms stock,stock,staged    # + noise floor
    python -m eval.ab --model nemotron-h-8b --workload standard-decode    # 1024/1024 x2 at 1,256 (+ noise floor)
    python -m eval.ab --model nemotron-h-8b --workload shared-prefix      # prefix caching, extra_buffer, hit rate
    python -m eval.ab --model tiny-qwen3-next --spec nextn --sim-acc-len 2.5
    python -m eval.ab --model qwen3-next-80b-a3b --tp 2                   # full size, --tp-size 2 (two GPUs)
    python -m eval.ab --render eval/results/ab-....json                   # re-draw md/png
    python -m eval.ab --list-models

``--arms`` lists the servers in order; every later arm is compared with the first one
(``stock,stock,staged`` gives ``stock-vs-stock``, the noise floor, and
``stock-vs-staged``).  Results: ``<out-dir>/ab-<model>[-<spec>]-<a>-vs-<b>.{json,md,png}`` (the arms'
kinds; a launch-config variant or a second comparison of the same kinds is named by the arms' labels,
e.g. ``stock-vs-staged-sf`` or ``stock-vs-staged-2``).

Models: a built-in geometry (``eval/models.py``; ``--load-format dummy`` with scaled random
weights from ``eval/weights.py``, the same seed on every server) or a model directory.
The harness writes the plugin entry points it needs (``eval/entry_points.py``) into a
temporary directory on the servers' ``PYTHONPATH``, so no ``pip install`` is needed.

Every bench run records SGLang's own decode rate at a full batch (its scheduler log) beside the client's
tok/s and flags the run *client-path bound* when the client's rate at a full batch (batch / median per-token ITL) is
more than 10% off it (eval/ab/decode_rate.py); ``--clients N`` drives each run from N bench_serving
processes, merged; ``--stream-interval N`` is SGLang's, on every server.

Prefix caching: ``--radix-cache off|on|no_buffer|extra_buffer`` is the same on every arm (``extra_buffer``:
SGLang's default strategy, overlap scheduler on, plus ``--replayssm-extra-buffer true`` (its default) for our
launcher's arms).  ``--workload shared-prefix`` benches SGLang's generated-shared-prefix dataset and
reports each server's cache hit rate (its ``Prefill batch ... #cached-token`` lines) beside TTFT p50/p99 and
tok/s; its parity prompts share prefixes, and each server's hits are compared with the same requests on a
flushed cache (eval/ab/prefix_cache.py, eval/ab/parity.py).

Speculative decoding (``--spec nextn``: the target's MTP draft; ``--spec eagle``: a separate draft model,
``--spec-draft-model DIR`` or the built-in geometry's dummy-weight EAGLE draft; ``--spec-topk K
--spec-draft-tokens N``: a tree instead of a chain): speed runs
use ``SGLANG_SIMULATE_ACC_LEN`` when ``--sim-acc-len`` is given (controlled acceptance).
Simulated acceptance replaces target tokens, so parity then runs on extra servers without
simulation: each arm with spec, and a non-spec stock reference (spec vs non-spec greedy
equality).
"""

# The names other modules (eval/soak.py, the tests) import from ``eval.ab``, wherever they live now.
from eval.ab.common import ROOT, SCHEMA, log
from eval.ab.plan import ARM_KINDS, SPEC_ALGOS, STOCK_KINDS, Phase, parse_arms, parse_batches, plan_phases
from eval.ab.servers import (ARM_SEAMS, METRIC_NAMES, PATCHED_MODULE, RECORDED_ENV_PREFIXES, STOCK_MODULE,
                             TRITON_IR_SUFFIXES, GpuMemSampler, ModelSpec, Server, ServerError, arm_launch,
                             common_server_flags, count_retractions, env_delta, free_port, http_json, http_post,
                             http_text, launch_cmd, parse_metrics, prepare_model, recorded_env, save_jitcache,
                             seams_state, conv_verify_state, server_env, server_facts, _stop_all)
from eval.ab.parity import (DLOGPROB_BINS, DLOGPROB_LABELS, compare_parity, parity_prompts, parse_generate_output,
                            run_parity, run_parity_solo, slim_outputs)
from eval.ab.profile import run_profile
from eval.ab.workloads import BENCH_KEYS, BenchDriver, PhaseRun, Progress, bench_serving_argv, run_phase, trim_bench
from eval.ab.results import (build_result, compare, comparisons, dist_version, git_commit, gpu_info, result_stem,
                             slim_phase)
from eval.ab.cli import build_parser, main

__all__ = ["ROOT", "SCHEMA", "log", "ARM_KINDS", "SPEC_ALGOS", "STOCK_KINDS", "Phase", "parse_arms", "parse_batches",
           "plan_phases", "ARM_SEAMS", "METRIC_NAMES", "PATCHED_MODULE", "RECORDED_ENV_PREFIXES", "STOCK_MODULE",
           "TRITON_IR_SUFFIXES", "GpuMemSampler", "ModelSpec", "Server", "ServerError", "arm_launch",
           "common_server_flags", "count_retractions", "env_delta", "free_port", "http_json", "http_post", "http_text",
           "launch_cmd", "parse_metrics", "prepare_model", "recorded_env", "save_jitcache", "seams_state",
           "conv_verify_state", "server_env", "server_facts", "_stop_all", "DLOGPROB_BINS", "DLOGPROB_LABELS", "compare_parity",
           "parity_prompts", "parse_generate_output", "run_parity", "run_parity_solo", "slim_outputs", "run_profile",
           "BENCH_KEYS", "BenchDriver", "PhaseRun", "Progress", "bench_serving_argv", "run_phase", "trim_bench",
           "build_result", "compare", "comparisons", "dist_version", "git_commit", "gpu_info", "result_stem",
           "slim_phase", "build_parser", "main"]
