"""``python -m eval.ab``: the command line, and ``main``, the run's plan in order."""

from __future__ import annotations

import argparse
import atexit
import math
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from eval.ab import decode_rate
from eval.ab.common import ROOT, log
from eval.ab.multiclient import split
from eval.ab.parity import parity_prompts, shared_prefix_prompts
from eval.ab.presets import WORKLOADS, apply_workload
from eval.ab.plan import Phase, parse_batches, plan_phases, spec_shape
from eval.ab.results import finish_record, model_tag, run_record, write_partial, write_results
from eval.ab.servers import (PATCHED_MODULE, RADIX_MODES, SPEC_ALGOS, STOCK_MODULE, ModelSpec, _stop_all, arm_launch,
                             env_delta, launch_cmd, prepare_models, server_env, server_pythonpath)
from eval.ab.workloads import bench_serving_argv, clear_gsp_cache, run_servers


def build_parser() -> argparse.ArgumentParser:
    from eval import ab  # the package's docstring is the --help text

    p = argparse.ArgumentParser(prog="python -m eval.ab", description=ab.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to run")
    g.add_argument("--model", default="tiny-nemotron-h", help="built-in geometry (--list-models) or a model dir")
    g.add_argument("--arms", default="stock,staged", help="servers in order, each stock, staged (our launcher as "
                   "users run it: the replay path), patched (our launcher with --replayssm-replay-ring false: "
                   "launch checks only) or upstream (stock + --enable-linear-replayssm), optionally :nospec "
                   "(a --spec run's non-speculative baseline); a patched or staged arm may end in @FILE, a kernel "
                   "launch-config YAML that replaces the packaged one for that server only (label <arm>-<file "
                   "stem>; make one with python -m eval.config_variant); later arms are compared with the first")
    g.add_argument("--batch", default="1,8,32,64", help="bench_serving --max-concurrency values")
    g.add_argument("--input-len", type=int, default=128)
    g.add_argument("--output-len", type=int, default=256)
    g.add_argument("--rounds", type=int, default=2, help="prompts per batch size = batch x rounds")
    g.add_argument("--min-prompts", type=int, default=4)
    g.add_argument("--warmup-requests", type=int, default=1)
    g.add_argument("--no-bench", action="store_true", help="parity only")
    g.add_argument("--no-parity", action="store_true", help="speed only")
    g.add_argument("--list-models", action="store_true")
    g.add_argument("--render", metavar="JSON", nargs="+", help="re-draw the .md/.png of result JSON files, exit")
    g.add_argument("--finish", metavar="PARTIAL", help="write the results of a run that was stopped before it wrote "
                   "them (its <out-dir>/ab-*-partial.json: the servers it finished) beside the partial file, exit")
    g.add_argument("--resume", metavar="PARTIAL", help="go on with a run that was stopped (its ab-*-partial.json, "
                   "or the ab-*-partial-kept.json kept by gpu_ab.sh or written by a run whose --deadline-s skipped "
                   "servers): its flags are the record's, the servers it finished are kept and the others run, then "
                   "its results are written to --out-dir; only the run-control flags (--out-dir, --log-dir, "
                   "--python, --deadline-s, --save-jitcache, --gpu-index, --no-progress, timeouts) may be given "
                   "beside it. Refused on another GPU model, git commit, installed SGLang version, set of "
                   "SGLANG_REPLAYSSM_* variables (names and values) or visible GPU count than the record's (start a "
                   "fresh run then); one the record lacks (an older record) is not checked, with a warning")
    g.add_argument("--dry-run", action="store_true", help="print the plan and the command lines, start nothing")
    g.add_argument("--workload", choices=("none", *WORKLOADS), default="none",
                   help="a named workload: standard-decode = random ids, 1024 in / 1024 out, two waves (prompts = "
                        "2 x batch) at --batch 1,256, arms stock,staged[,upstream for GDN models],stock (the last: "
                        "the stock-vs-stock noise floor); shared-prefix = bench_serving's generated-shared-prefix "
                        "dataset (--gsp-* below, --output-len 256) at --batch 16,64 with --radix-cache extra_buffer, "
                        "arms stock,staged, each run's prefix cache flushed after warm-up, TTFT and the server's "
                        "cache hit rate reported, parity on prompts sharing prefixes (hit vs cold too); it sets the "
                        "flags not given on the command line (eval/ab/presets.py)")
    g.add_argument("--gsp-groups", type=int, default=16, metavar="G",
                   help="--workload shared-prefix: prompt groups, one system prompt each (--gsp-num-groups)")
    g.add_argument("--gsp-prompts-per-group", type=int, default=16, metavar="N",
                   help="--workload shared-prefix: prompts per group (each run sends G x N prompts)")
    g.add_argument("--gsp-system-len", type=int, default=2048, metavar="TOKENS",
                   help="--workload shared-prefix: the shared system prompt's tokens (--gsp-system-prompt-len)")
    g.add_argument("--gsp-question-len", type=int, default=128, metavar="TOKENS",
                   help="--workload shared-prefix: each prompt's own question after it")
    g.add_argument("--clients", type=int, default=1, metavar="N",
                   help="bench_serving processes per run: each takes ~batch/N of the concurrency and its share of the "
                        "prompts, started together; their per-request records are merged into one result (output "
                        "tok/s over the union window, TTFT/TPOT/ITL percentiles over all requests), so a client that "
                        "caps on its own CPU does not cap the measurement (eval/ab/multiclient.py)")
    s = p.add_argument_group("SGLang server flags (identical on every arm)")
    s.add_argument("--attention-backend", default=None, help="default: the geometry's (flashinfer/triton)")
    s.add_argument("--load-format", default=None, help="default: dummy for built-in geometries")
    s.add_argument("--sampling-backend", default="pytorch")
    s.add_argument("--mem-fraction-static", type=float, default=0.0,
                   help="default: 0.25 for tiny built-in geometries, 0.85 otherwise")
    s.add_argument("--context-length", type=int, default=4096)
    s.add_argument("--max-running-requests", type=int, default=0, help="0: SGLang decides (reported)")
    s.add_argument("--tp", type=int, default=1, metavar="N",
                   help="tensor parallelism: --tp-size N on every server (N GPUs each, SGLang's own NCCL TP; "
                        "peak memory is sampled on --gpu-index, the first GPU, i.e. one rank's share); a built-in "
                        "geometry too large for one GPU names its minimum (--list-models)")
    s.add_argument("--cuda-graph", choices=("on", "off"), default="on")
    s.add_argument("--radix-cache", choices=RADIX_MODES, default="off",
                   help="off: --disable-radix-cache; on (= no_buffer): radix cache with SGLang's no_buffer mamba "
                        "strategy and --disable-overlap-schedule (SGLang 0.5.17 runs no_buffer only without the "
                        "overlap scheduler); extra_buffer: --mamba-radix-cache-strategy extra_buffer on every arm, "
                        "overlap scheduler on (SGLang's default), and --replayssm-extra-buffer true (its default) "
                        "on our launcher's arms (staged, patched); default: no radix flag, every server on its own "
                        "defaults (what a user who gives none gets)")
    s.add_argument("--cuda-graph-max-bs", type=int, default=0, help="default: the largest --batch")
    s.add_argument("--prefill-graph", choices=("default", "off"), default="off")
    s.add_argument("--stream-interval", type=int, default=0, metavar="N",
                   help="SGLang --stream-interval on every server: tokens per streamed event (0: SGLang's default, "
                        "1). Above ~7-8k streamed tokens/s per server the CPU path can cap what the client sees "
                        "(issue 24; python -m eval.streaming_cap measures it); 8 lifts it")
    s.add_argument("--server-arg", action="append", help="extra SGLang flags for every server (shell-split)")
    s.add_argument("--patched-arg", action="append", help="extra flags for the patched and staged arms' launcher, "
                   "e.g. '--replayssm-buffer-len 16'")
    s.add_argument("--seed", type=int, default=0, help="SGLang --random-seed, bench and parity prompt seed")
    s.add_argument("--test-retract", type=int, default=0, metavar="N",
                   help="force retraction on every server: SGLang's SGLANG_TEST_RETRACT=1 with "
                        "SGLANG_TEST_RETRACT_INTERVAL=N (one running request retracted and later re-prefilled every "
                        "N forward passes); the servers table counts the retracted requests (0: off)")
    s.add_argument("--host", default="127.0.0.1")
    w = p.add_argument_group("weights")
    w.add_argument("--random-weights", dest="random_weights", action="store_true", default=True,
                   help="scaled random weights via eval/weights.py (default with dummy load format)")
    w.add_argument("--no-random-weights", dest="random_weights", action="store_false")
    w.add_argument("--weight-seed", type=int, default=0)
    w.add_argument("--sync-debug", action="store_true",
                   help="count the host syncs PyTorch sees in every server process by call site "
                        "(eval/sync_debug.py; needs the random weights' plugin); each server's record gets the "
                        "last census (sync_sites) and its log the periodic lines")
    w.add_argument("--pinned-token", type=int, default=None, metavar="ID",
                   help="on top of the random weights, make every greedy pick token ID, of the target and of a "
                        "separate EAGLE draft alike (eval/weights.py pin_argmax_): the drafts are then accepted at "
                        "every step, along a real tree path for --spec-topk > 1, and the spec-vs-non-spec parity "
                        "compares logprobs along it (default: off)")
    sp = p.add_argument_group("speculative decoding")
    sp.add_argument("--spec", choices=sorted(SPEC_ALGOS), default="none")
    sp.add_argument("--spec-steps", type=int, default=3, help="draft steps (--speculative-num-steps)")
    sp.add_argument("--spec-topk", type=int, default=1, metavar="K",
                    help="--speculative-eagle-topk: 1 drafts a chain of --spec-steps + 1 tokens; K > 1 a tree "
                         "(needs --spec-draft-tokens)")
    sp.add_argument("--spec-draft-tokens", type=int, default=0, metavar="N",
                    help="--speculative-num-draft-tokens: a tree's nodes, root included (default and only value "
                         "for a chain: --spec-steps + 1)")
    sp.add_argument("--spec-draft-model", default=None,
                    help="a separate draft model dir for every arm (--speculative-draft-model-path); default: "
                         "--spec eagle on a built-in geometry writes its dummy-weight EAGLE draft "
                         "(LlamaForCausalLMEagle sized to the target, --list-models), --spec nextn the target's MTP")
    sp.add_argument("--sim-acc-len", type=float, default=None, help="SGLANG_SIMULATE_ACC_LEN for the speed runs")
    sp.add_argument("--sim-acc-method", default="match-expected")
    sp.add_argument("--sim-acc-token-mode", choices=("auto", "real-draft-token", "fixed"), default="auto",
                    help="SGLANG_SIMULATE_ACC_TOKEN_MODE: auto = real-draft-token for a chain (--spec-topk 1: the "
                         "draft's own tokens are accepted), fixed for a tree (SGLang 0.5.17 refuses real draft tokens "
                         "with --speculative-eagle-topk > 1; every output token is then one fixed id)")
    sp.add_argument("--no-spec-parity", dest="spec_parity", action="store_false", default=True,
                    help="skip the extra parity servers of a spec run")
    pr = p.add_argument_group("profile (eval/profile_trace.py)")
    pr.add_argument("--profile-batch", default="", metavar="B[,B...]",
                    help="after the speed runs, one more bench_serving run per listed concurrency on each server "
                         "while SGLang's /start_profile traces --profile-steps forward steps (GPU kernels only); "
                         "the result gets each arm's kernel time per step by group and the traces (default: off)")
    pr.add_argument("--profile-steps", type=int, default=20, help="forward steps in the traced window")
    pr.add_argument("--profile-delay-s", type=float, default=3.0,
                    help="seconds into the profiled run before tracing starts (the batch fills first)")
    pa = p.add_argument_group("parity")
    pa.add_argument("--parity-prompts", type=int, default=8)
    pa.add_argument("--parity-tokens", type=int, default=1024)
    pa.add_argument("--parity-topk", type=int, default=5)
    pa.add_argument("--parity-groups", type=int, default=4, metavar="G",
                    help="--workload shared-prefix: the --parity-prompts form G groups sharing a prefix "
                         "(--gsp-system-len tokens, a little shorter per group); the first of each group is sent "
                         "on a flushed cache, the others then hit its prefix, and each is sent again on a flushed "
                         "cache (hit vs cold per server, summary prefix_parity)")
    pa.add_argument("--parity-solo", action="store_true",
                    help="also send the parity prompts one at a time; stock batched vs stock solo is reported as "
                         "the engine's own noise floor (parity_noise_floor)")
    pa.add_argument("--near-tie-tol", type=float, default=0.05, help="nats; top-2 gap under which a flip is a near-tie")
    o = p.add_argument_group("run control and output")
    o.add_argument("--out-dir", default=str(ROOT / "eval" / "results"))
    o.add_argument("--tag", default=None, help="suffix for the result file names")
    o.add_argument("--log-dir", default=None, help="server and bench logs (default: <out-dir>/logs-<stem>)")
    o.add_argument("--python", default=sys.executable, help="interpreter for the servers and bench_serving")
    o.add_argument("--stock-module", default=STOCK_MODULE)
    o.add_argument("--patched-module", default=PATCHED_MODULE)
    o.add_argument("--entry-points", choices=("auto", "skip"), default="auto",
                   help="auto: write the plugin dist-infos into a temp dir on the servers' PYTHONPATH")
    o.add_argument("--server-timeout", type=float, default=600.0)
    o.add_argument("--bench-timeout", type=float, default=600.0)
    o.add_argument("--parity-timeout", type=float, default=600.0)
    o.add_argument("--shutdown-grace", type=float, default=30.0)
    o.add_argument("--deadline-s", type=float, default=0.0, help="stop starting work after this many seconds")
    o.add_argument("--reserve-s", type=float, default=20.0, help="time kept for shutdown/reporting under a deadline")
    o.add_argument("--min-phase-s", type=float, default=60.0, help="skip a server if less time than this is left")
    o.add_argument("--save-jitcache", default=None, metavar="DIR", help="tar the JIT caches after the first server")
    o.add_argument("--concurrent-start", action="store_true",
                   help="start every server before measuring any (one cold JIT compile, one import wait; each "
                        "starts once the one before has allocated its memory pools, which SGLang sizes from the "
                        "free GPU memory), then measure them one at a time while the others idle; recorded in the "
                        "result. Size the pools so that all fit (e.g. --mem-fraction-static 0.2)")
    o.add_argument("--gpu-index", default=None, help="GPU for peak-memory sampling (default: first visible)")
    o.add_argument("--noise-band", type=float, default=0.03, help="|ratio-1| reported as noise")
    o.add_argument("--no-progress", action="store_true")
    return p


def checked_plan(args) -> List[Phase]:
    """The plan, once the flags it does not read are checked too (a ValueError names the flag)."""
    phases = plan_phases(args)
    parse_batches(args.batch)
    check_tp(args)
    check_spec(args)
    from .servers import sim_acc_token_mode

    args.sim_acc_token_mode = sim_acc_token_mode(args)  # recorded as the mode the servers get
    if args.sync_debug and not args.random_weights:
        raise ValueError("--sync-debug rides on the random weights' plugin: drop --no-random-weights")
    if args.pinned_token is not None and (args.pinned_token < 0 or not args.random_weights):
        raise ValueError("--pinned-token takes a token id (an integer >= 0) and the random weights (drop "
                         f"--no-random-weights), got {args.pinned_token}")
    if args.stream_interval < 0:
        raise ValueError(f"--stream-interval takes a positive number of tokens (0: SGLang's default), got "
                         f"{args.stream_interval}")
    split(min(parse_batches(args.batch)), 1, args.clients)  # every client needs a concurrent request
    check_prefix(args)
    if args.profile_batch:
        parse_batches(args.profile_batch, "--profile-batch")
        if args.profile_steps < 1 or args.profile_delay_s < 0:
            raise ValueError("--profile-steps takes a positive integer and --profile-delay-s a non-negative "
                             f"number, got {args.profile_steps} and {args.profile_delay_s}")
    return phases


def check_prefix(args) -> None:
    """``--workload shared-prefix``'s flags (a ValueError names the flag)."""
    if getattr(args, "workload", "none") != "shared-prefix":
        return
    for flag in ("gsp_groups", "gsp_prompts_per_group", "gsp_system_len", "gsp_question_len", "parity_groups"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} takes a positive integer, got {getattr(args, flag)}")
    if args.clients != 1:
        raise ValueError("--workload shared-prefix runs one bench_serving client (--clients 1): each client would "
                         "draw its own prompt groups and flush the prefix cache under the others")
    longest = args.gsp_system_len + args.gsp_question_len + args.output_len
    if longest > args.context_length:
        raise ValueError(f"--workload shared-prefix: --gsp-system-len + --gsp-question-len + --output-len = {longest} "
                         f"tokens exceed --context-length {args.context_length}; raise it or shorten the prompts")
    per, odd = divmod(args.parity_prompts, args.parity_groups)
    if not args.no_parity and (odd or per < 2):
        raise ValueError(f"--workload shared-prefix: --parity-prompts {args.parity_prompts} must be a multiple of "
                         f"--parity-groups {args.parity_groups}, at least two prompts per group (a cold one, a hit)")
    if not args.no_parity and args.gsp_system_len + args.gsp_question_len + args.parity_tokens > args.context_length:
        raise ValueError(f"--workload shared-prefix: parity prompts (--gsp-system-len + --gsp-question-len) + "
                         f"--parity-tokens exceed --context-length {args.context_length}; lower --parity-tokens")


def check_spec(args) -> None:
    """The speculative shape (``spec_shape``) and, for ``--spec eagle``, a draft model to serve (a ValueError
    names the flag)."""
    from eval import models

    spec_shape(args)
    if args.spec == "eagle" and not args.spec_draft_model and args.model not in models.EAGLE_DRAFT_LAYERS:
        raise ValueError(f"--spec eagle: --model {args.model} has no built-in EAGLE draft (built-in: "
                         f"{', '.join(models.eagle_draft_names())}); pass --spec-draft-model DIR")


def check_tp(args) -> None:
    """``--tp`` is a positive GPU count, at least what a built-in geometry needs (a ValueError names the flag)."""
    from eval import models

    if args.tp < 1:
        raise ValueError(f"--tp takes a positive number of GPUs per server, got {args.tp}")
    g = models.GEOMETRIES.get(args.model)
    if g is not None and args.tp < g.min_tp:
        raise ValueError(f"--model {g.name} needs --tp {g.min_tp} or more (it does not fit {args.tp} GPU"
                         f"{'s' if args.tp > 1 else ''}: {g.min_tp_reason}), got --tp {args.tp}")


def print_plan(args, phases: List[Phase], spec_models: Dict[bool, Optional[ModelSpec]], flags: Dict[bool, List[str]],
               base_env: Dict[str, str], pythonpath: List[str]) -> None:
    """``--dry-run``: each server's environment changes and command line, and its bench_serving runs."""
    for ph in phases:
        module, extra = arm_launch(args, ph.kind)
        cmd = launch_cmd(args.python, module, flags[ph.spec], args.host, 30000, extra)
        env = env_delta(server_env(base_env, args, ph, spec_models[ph.spec], pythonpath), base_env)
        print(f"# {ph.label} ({ph.role}): bench={ph.bench} parity={ph.parity}")
        print("  env: " + " ".join(f"{k}={v}" for k, v in env.items()))
        print("  " + shlex.join(cmd))
        if ph.bench:
            for b in parse_batches(args.batch):
                print("  python -m sglang.bench_serving "
                      + shlex.join(bench_serving_argv("http://127.0.0.1:30000", spec_models[ph.spec], b, args,
                                                      f"bench-{ph.label}-b{b}.jsonl")))


def load_partial(path: Path) -> tuple:
    """A partial eval.ab record (``write_partial``) and the harness flags it ran with (a ValueError if it is none)."""
    import json

    run = json.loads(Path(path).read_text())
    harness = (run.get("flags") or {}).get("harness")
    if not isinstance(harness, dict) or not isinstance(run.get("phases"), list):
        raise ValueError(f"{path} is not a partial eval.ab record (no flags.harness or no phases)")
    return run, harness


def in_plan_order(run: Dict, phases: List[Phase]) -> None:
    """The run's server records in the plan's order (the first arm is the baseline); a resumed run appends the
    servers it runs after those it kept."""
    order = {ph.label: i for i, ph in enumerate(phases)}
    run["phases"].sort(key=lambda p: order.get(p["label"], len(order)))


def deadline_cut(p: Dict) -> bool:
    """A server record some of whose runs (bench batches, parity, profiles) the deadline skipped."""
    parts = [*(p.get("bench") or []), *(p.get("profiles") or []), p.get("parity"), p.get("parity_solo")]
    return any(isinstance(x, dict) and x.get("skipped") == "deadline" for x in parts)


def resume_record(run: Dict, args, argv: Optional[List[str]], phases: List[Phase], model0: ModelSpec,
                  flags: Dict[bool, List[str]], prompts: List[List[int]], t_start: float) -> tuple:
    """A stopped run's record to go on with, and the servers it still needs: those it finished (status ok, no run
    of it skipped by the deadline) are kept, any other record of a server is dropped and that server runs again;
    each call is listed in ``run["calls"]``."""
    here = run_record(args, argv, phases, model0, flags, prompts, t_start)
    if run.get("parity_setup", {}).get("prompt_lens") != here["parity_setup"]["prompt_lens"]:
        raise ValueError("the parity prompts differ from the record's (another seed or vocabulary)")
    done = {p["label"] for p in run["phases"] if p.get("status") == "ok" and not deadline_cut(p)}
    dropped = [p["label"] for p in run["phases"] if p["label"] not in done]
    run["phases"] = [p for p in run["phases"] if p["label"] in done]
    todo = [ph for ph in phases if ph.label not in done]
    calls = run.setdefault("calls", [{k: run.get(k) for k in ("started", "host", "gpu", "git_commit")}
                                     | {"servers": sorted(done)}])
    calls.append({k: here[k] for k in ("started", "host", "gpu", "git_commit")}
                 | {"servers": [ph.label for ph in todo], "argv": here["flags"]["argv"]})
    log(f"resuming the run started {run.get('started')}: kept {', '.join(sorted(done)) or 'none'}"
        + (f", running again {', '.join(dropped)}" if dropped else "")
        + f"; to run: {', '.join(ph.label for ph in todo) or 'none'}")
    return run, todo


def finish_partial(partial: Path) -> None:
    """``--finish``: the results of a stopped run from its partial record (the harness flags it ran with, the servers
    it finished), written beside it as the run would have written them; the partial file goes."""
    from types import SimpleNamespace

    run, harness = load_partial(partial)
    if not run["phases"]:
        raise ValueError(f"{partial}: no server finished, no results to write")
    args = argparse.Namespace(**harness)
    if run.get("calls"):  # a resumed run
        in_plan_order(run, plan_phases(args))
    log(f"finishing {partial} ({len(run['phases'])} server(s): {', '.join(p['label'] for p in run['phases'])})")
    run["finished_from_partial"] = str(partial)  # no end time or wall time: the run stopped before it recorded them
    if run.get("sglang_version") is None:
        run["sglang_version"] = next((((p.get("facts") or {}).get("version")) for p in run["phases"]
                                      if (p.get("facts") or {}).get("version")), None)
    for p in run["phases"]:  # the client-path flag by the rule of now (eval/ab/decode_rate.py)
        for e in p.get("bench") or []:
            if e.get("rates"):
                e["rates"] = decode_rate.rejudge(e["rates"], e.get("result"))
    stem0 = partial.name[:-len("-partial.json")] if partial.name.endswith("-partial.json") else partial.stem
    name = (run.get("model") or {}).get("name") or Path(str(harness["model"])).name
    write_results(run, args, SimpleNamespace(name=name), partial.parent, stem0, partial)


# what a resumed run may set for itself: where it writes, how long it may take; everything else is the record's
RESUME_OWN = ("resume", "out_dir", "log_dir", "python", "deadline_s", "reserve_s", "min_phase_s", "save_jitcache",
              "gpu_index", "no_progress", "server_timeout", "bench_timeout", "parity_timeout", "shutdown_grace")


def check_resume_env(run: Dict) -> None:
    """``--resume``: the installed SGLang, the ``SGLANG_REPLAYSSM_*`` settings and the visible GPU count as the
    record has them (a ValueError names what differs, the record's value and this call's); what the record does not
    hold (an older record) or either side cannot tell is not checked, with a warning."""
    from eval.ab.results import dist_version, visible_gpus
    from eval.ab.servers import recorded_env

    def warn(what: str, was, now) -> None:
        print(f"python -m eval.ab: warning: --resume: {what} not checked (the record's: {was}, now: {now})",
              file=sys.stderr, flush=True)

    def same(what: str, key: str, now, differ: str) -> None:
        """The record's ``key`` against this call's value: a refusal when they differ, a warning when either is
        unknown or the record has no such field."""
        was = run.get(key)
        if key not in run or was is None or now is None:
            warn(what, "not recorded (an older record)" if key not in run else "unknown" if was is None else was,
                 "unknown" if now is None else now)
        elif now != was:
            raise ValueError(differ.format(was=was, now=now) + "; start a fresh run instead")

    same("the SGLang version", "sglang_version", dist_version("sglang"),
         "the run started with SGLang {was}, this interpreter has SGLang {now}: its arms would not compare")
    prefix = "SGLANG_REPLAYSSM_"
    now_env = {k: v for k, v in recorded_env(dict(os.environ)).items() if k.startswith(prefix)}
    if not isinstance(run.get("env_inherited"), dict):
        warn(f"the {prefix}* settings", "not recorded (an older record)",
             ", ".join(f"{k}={v}" for k, v in now_env.items()) or "none")
    else:
        was_env = {k: v for k, v in run["env_inherited"].items() if k.startswith(prefix)}
        diff = sorted(k for k in set(was_env) | set(now_env) if was_env.get(k) != now_env.get(k))
        if diff:
            def show(env: Dict[str, str]) -> str:
                return ", ".join(f"{k}={env[k]}" if k in env else f"{k} unset" for k in diff)

            raise ValueError(f"the run started with {show(was_env)}, this environment has {show(now_env)}: its "
                             f"{prefix}* settings differ; start a fresh run instead")
    same("the visible GPU count", "visible_gpus", visible_gpus(),
         "the run started with {was} visible GPU(s), this host has {now}: its arms would not compare")


def resume_args(args, parser: argparse.ArgumentParser, argv: Optional[List[str]] = None) -> tuple:
    """``--resume``: the stopped run's record and its harness flags, with this call's run-control flags over them
    (a ValueError names what is refused)."""
    from eval.ab.presets import given_flags

    argv = list(argv or [])
    refused = given_flags(parser, argv) - set(RESUME_OWN)  # at its default value too
    if refused:  # each named as given (a store_false flag by its own name: --no-spec-parity)
        given = []
        for d in sorted(refused):
            opts = [o for a in parser._actions if a.dest == d for o in a.option_strings]
            given.append(next((o for o in opts if any(x == o or x.startswith(o + "=") for x in argv)), opts[0]))
        raise ValueError(f"--resume takes the run's flags from its record; drop {' '.join(sorted(given))}")
    run, harness = load_partial(Path(args.resume))
    if run.get("finished"):
        raise ValueError(f"{args.resume} is a finished run's record, not a partial one")
    from eval.ab.results import git_commit, gpu_info

    now_gpu, now_commit = (gpu_info() or {}).get("name"), git_commit()
    was_gpu, was_commit = (run.get("gpu") or {}).get("name"), run.get("git_commit")
    if now_gpu and was_gpu and now_gpu != was_gpu:
        raise ValueError(f"the run started on {was_gpu}, this host has {now_gpu}: its arms would not compare")
    if now_commit and was_commit and "unknown" not in (now_commit, was_commit) and now_commit != was_commit:
        raise ValueError(f"the run started at git commit {was_commit}, this tree is {now_commit}: check that "
                         "commit out (or set GIT_COMMIT) to resume it")
    check_resume_env(run)
    # a flag the record's harness did not have yet takes its default (as the run ran without it)
    merged = {**vars(parser.parse_args([])), "workload_set": [], **harness}
    merged.update({k: getattr(args, k) for k in RESUME_OWN if k != "resume"})
    merged["resume"] = None
    return run, argparse.Namespace(**merged)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from eval import ab_report, models

    if args.list_models:
        return models.main()
    if args.render:
        for path in args.render:
            print(ab_report.render(path))
        return 0
    if args.finish:
        try:
            finish_partial(Path(args.finish))
        except (OSError, ValueError, KeyError) as e:
            print(f"python -m eval.ab: error: --finish {args.finish}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        return 0
    resumed = None
    try:
        if args.resume:
            resumed, args = resume_args(args, parser, sys.argv[1:] if argv is None else argv)
        else:
            args.workload_set = apply_workload(args, parser, sys.argv[1:] if argv is None else argv)
        phases = checked_plan(args)
    except (OSError, ValueError) as e:
        print(f"python -m eval.ab: error: {e}", file=sys.stderr)
        return 2
    if args.workload_set:
        print(f"--workload {args.workload}: {' '.join(args.workload_set)}", flush=True)
    if args.gpu_index is None:
        args.gpu_index = (os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") or ["0"])[0] or "0"
    t_start = time.time()
    deadline = t_start + args.deadline_s if args.deadline_s > 0 else math.inf
    workdir = Path(tempfile.mkdtemp(prefix="replayssm-ab-"))
    spec_models, flags = prepare_models(args, phases, workdir)
    model0 = spec_models[phases[0].spec]
    out_dir = Path(args.out_dir)
    stem0 = "-".join(["ab", model_tag(model0.name, args)] + ([args.spec] if args.spec != "none" else [])
                     + ([args.tag] if args.tag else []))
    logdir = Path(args.log_dir) if args.log_dir else out_dir / f"logs-{stem0}"
    pythonpath = server_pythonpath(args, workdir)
    base_env = dict(os.environ)
    if args.dry_run:
        print_plan(args, phases, spec_models, flags, base_env, pythonpath)
        return 0

    atexit.register(_stop_all)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: (_stop_all(), sys.exit(130)))
    vocab = int(model0.config.get("vocab_size", 1024))
    if args.workload == "shared-prefix":
        prompts = shared_prefix_prompts(args.parity_groups, args.parity_prompts // args.parity_groups, vocab,
                                        args.seed, args.gsp_system_len, args.gsp_question_len)
        clear_gsp_cache(args, model0)
    else:
        prompts = parity_prompts(args.parity_prompts, vocab, args.seed)
    partial = out_dir / f"{stem0}-partial.json"
    if resumed is None:
        run = run_record(args, argv, phases, model0, flags, prompts, t_start)
        todo = phases
    else:
        try:
            run, todo = resume_record(resumed, args, argv, phases, model0, flags, prompts, t_start)
        except ValueError as e:
            print(f"python -m eval.ab: error: {e}", file=sys.stderr)
            return 2
    run_servers(run, args, todo, spec_models, flags, base_env, pythonpath, logdir, prompts, deadline, partial)
    in_plan_order(run, phases)
    skipped = [p["label"] for p in run["phases"] if p.get("status") == "skipped" or deadline_cut(p)]
    if skipped:  # the deadline left servers out: a record a later call can go on with
        kept = out_dir / f"{stem0}-partial-kept.json"
        write_partial(kept, run)
        log(f"{', '.join(skipped)} skipped: python -m eval.ab --resume {kept} runs them in a later call")
    finish_record(run, t_start)
    pairs = write_results(run, args, model0, out_dir, stem0, partial)
    ok = all(p.get("status") == "ok" for p in run["phases"])
    print(ab_report.stdout_summary(run, pairs, args), flush=True)
    return 0 if ok else 1
