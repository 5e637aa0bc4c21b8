"""Greedy parity: the prompts, ``/generate`` answers parsed to tokens and logprobs, and the token-by-token
comparison of two servers' answers (near-ties told apart from mismatches).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from eval.ab.servers import http_json, http_post


DLOGPROB_BINS = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
DLOGPROB_LABELS = ("0", "≤1e-6", "≤1e-5", "≤1e-4", "≤1e-3", "≤1e-2", "≤0.1", ">0.1")


def parity_prompts(n: int, vocab: int, seed: int) -> List[List[int]]:
    """Deterministic random token-id prompts of varied length (ids 3..vocab-1)."""
    rng = random.Random(seed)
    lengths = [7, 33, 64, 100, 128, 200, 257, 300]
    return [[rng.randrange(3, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


def shared_prefix_prompts(groups: int, per_group: int, vocab: int, seed: int, prefix_len: int,
                          question_len: int) -> List[List[int]]:
    """``groups`` x ``per_group`` deterministic token-id prompts, group-major: the prompts of a group share a
    random prefix, then each has its own question.  The prefixes are a little shorter group after group and the
    questions vary in length, so cached prefixes end at several offsets of the replay ring's cycle."""
    rng = random.Random(seed + 19)
    out = []
    for g in range(groups):
        prefix = [rng.randrange(3, vocab) for _ in range(max(1, prefix_len - 37 * g))]
        for j in range(per_group):
            q = max(1, question_len - 13 * j - 5 * g)
            out.append(prefix + [rng.randrange(3, vocab) for _ in range(q)])
    return out


def run_parity_prefix(url: str, prompts: List[List[int]], groups: int, n_tokens: int, topk: int, timeout: float,
                      sample_path: Optional[Path] = None) -> Dict[str, Any]:
    """Greedy parity with prefix-cache hits (``--workload shared-prefix``): on a flushed cache, the first prompt
    of every group (cold, and its prefix enters the cache), then the others in one batch (they hit it): these are
    ``outputs``, in prompt order, compared across servers like any parity run.  Then each later member again, on
    a flushed cache, one member of every group per batch (no two share a prefix): ``cold_outputs``, the same
    requests without a hit, which ``compare`` sets against the hits (``prefix_parity``)."""
    per = len(prompts) // groups
    t0 = time.time()
    idx = [[g * per + j for g in range(groups)] for j in range(per)]  # idx[j]: member j of every group
    outs: List[Optional[Dict[str, Any]]] = [None] * len(prompts)
    cold: List[Optional[Dict[str, Any]]] = [None] * len(prompts)
    flushes = [_flush(url)]
    first = run_parity(url, [prompts[i] for i in idx[0]], n_tokens, topk, timeout, sample_path)["outputs"]
    for i, o in zip(idx[0], first):
        outs[i] = o
    rest = [i for j in range(1, per) for i in idx[j]]
    for i, o in zip(rest, run_parity(url, [prompts[i] for i in rest], n_tokens, topk, timeout)["outputs"]):
        outs[i] = o
    for j in range(1, per):
        flushes.append(_flush(url))
        for i, o in zip(idx[j], run_parity(url, [prompts[i] for i in idx[j]], n_tokens, topk, timeout)["outputs"]):
            cold[i] = o
    hit_idx = [i for i in range(len(prompts)) if cold[i] is not None]
    return {"seconds": round(time.time() - t0, 2), "outputs": outs, "groups": groups, "hit_prompts": hit_idx,
            "cold_outputs": [cold[i] for i in hit_idx], "flushes_ok": all(flushes)}


def _flush(url: str) -> bool:
    """SGLang's ``/flush_cache`` (empties the radix cache; refused while requests still run, so tried again)."""
    for attempt in range(3):
        code, _ = http_post(url + "/flush_cache", {}, timeout=60)
        if code == 200:
            return True
        time.sleep(1.0 + attempt)
    return False


def _top_dict(entry) -> Dict[int, float]:
    out: Dict[int, float] = {}
    for item in entry or []:
        if item and len(item) >= 2 and item[1] is not None and item[0] is not None:
            out[int(item[1])] = float(item[0])
    return out


def parse_generate_output(item: dict) -> Dict[str, Any]:
    """tokens, chosen-token logprobs and top-k dicts from one ``/generate`` result."""
    meta = item.get("meta_info", {}) or {}
    otl = meta.get("output_token_logprobs") or []
    tokens = [int(t[1]) for t in otl] if otl else [int(t) for t in item.get("output_ids", [])]
    lps = [None if t[0] is None else float(t[0]) for t in otl] if otl else [None] * len(tokens)
    top = [_top_dict(e) for e in (meta.get("output_top_logprobs") or [])]
    out = {"tokens": tokens, "logprobs": lps, "top": top}
    if "spec_accept_length" in meta:
        out["spec_accept_length"] = meta["spec_accept_length"]
    return out


def run_parity(url: str, prompts: List[List[int]], n_tokens: int, topk: int, timeout: float,
               sample_path: Optional[Path] = None) -> Dict[str, Any]:
    payload = {"input_ids": prompts,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": n_tokens, "ignore_eos": True},
               "return_logprob": True, "top_logprobs_num": topk}
    t0 = time.time()
    res = http_json(url + "/generate", payload, timeout=timeout)
    if isinstance(res, dict):
        res = [res]
    if sample_path is not None and res:  # a short raw sample of the server's answer, for the tests
        try:
            sample_path.write_text(json.dumps(_truncate_generate(res[0], 8), indent=1))
        except OSError:
            pass
    outs = [parse_generate_output(r) for r in res]
    return {"seconds": round(time.time() - t0, 2), "outputs": outs}


def run_parity_solo(url: str, prompts: List[List[int]], args, deadline: float) -> Dict[str, Any]:
    """The parity prompts again, one request at a time: the same tokens through a batch of one.
    Stock batched vs stock solo is the noise floor of the serving engine itself (GEMM tilings
    and reduction orders change with the batch; with the radix cache on, the repeats also hit
    the prefixes cached by the batched run)."""
    t0, outs = time.time(), []
    for pr in prompts:
        res = run_parity(url, [pr], args.parity_tokens, args.parity_topk,
                         timeout=min(args.parity_timeout, max(10.0, deadline - time.time())))
        outs += res["outputs"]
    return {"seconds": round(time.time() - t0, 2), "outputs": outs}


def _truncate_generate(item: dict, n: int) -> dict:
    out = {k: v for k, v in item.items() if k != "meta_info"}
    if isinstance(out.get("output_ids"), list):
        out["output_ids"] = out["output_ids"][:n]
    if isinstance(out.get("text"), str):
        out["text"] = " ".join(out["text"].split()[:n])
    meta = dict(item.get("meta_info") or {})
    for k in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs"):
        if isinstance(meta.get(k), list):
            meta[k] = meta[k][:n]
    out["meta_info"] = meta
    return out


def slim_outputs(outs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """What the result JSON keeps of a parity run: tokens and chosen-token logprobs (8 digits)."""
    return [{"tokens": o["tokens"], "logprobs": [None if x is None else float(f"{x:.8g}") for x in o["logprobs"]]}
            for o in outs]


def prefix_parity(par: Dict[str, Any], near_tie_tol: float, expected_tokens: Optional[int]) -> Optional[Dict[str, Any]]:
    """One server's prefix-hit requests against the same requests on a flushed cache (``run_parity_prefix``);
    None for a parity run without them."""
    if not par.get("cold_outputs") or "outputs" not in par:
        return None
    hits = [par["outputs"][i] for i in par["hit_prompts"]]
    return compare_parity(par["cold_outputs"], hits, near_tie_tol, expected_tokens)


def _bin_index(d: float) -> int:
    if d == 0.0:
        return 0
    for i, edge in enumerate(DLOGPROB_BINS[1:], start=1):
        if d <= edge:
            return i
    return len(DLOGPROB_BINS)


def compare_parity(ref: List[Dict[str, Any]], other: List[Dict[str, Any]], near_tie_tol: float,
                   expected_tokens: Optional[int] = None) -> Dict[str, Any]:
    """Token-by-token comparison of two parity runs (same prompts, greedy).

    Per prompt, tokens are compared up to the first divergence (after it the sequences
    condition on different text).  A divergence where each side's top-2 gap between the two
    tokens is <= ``near_tie_tol`` is a logged near-tie, not a mismatch.  |Δlogprob| is taken
    over the common prefix, for the chosen token and for top-k tokens present on both sides.
    """
    hist = [0] * len(DLOGPROB_LABELS)
    max_d = 0.0
    max_dk = 0.0
    compared = identical = mismatches = 0
    near, diverged, first = [], [], []
    missing_lp = 0
    for p, (a, b) in enumerate(zip(ref, other)):
        ta, tb = a["tokens"], b["tokens"]
        n = min(len(ta), len(tb))
        div = next((i for i in range(n) if ta[i] != tb[i]), None)
        if div is None and len(ta) != len(tb):
            div = n
        upto = n if div is None else min(div, n)
        compared += upto
        for i in range(upto):
            la = a["logprobs"][i] if i < len(a["logprobs"]) else None
            lb = b["logprobs"][i] if i < len(b["logprobs"]) else None
            if la is None or lb is None:
                missing_lp += 1
                continue
            d = abs(la - lb)
            max_d = max(max_d, d)
            hist[_bin_index(d)] += 1
            if i < len(a["top"]) and i < len(b["top"]):
                for tok in set(a["top"][i]) & set(b["top"][i]):
                    max_dk = max(max_dk, abs(a["top"][i][tok] - b["top"][i][tok]))
        first.append(div)
        if div is None:
            identical += 1
            continue
        rec = {"prompt": p, "pos": div}
        if div < n:
            ta_i, tb_i = ta[div], tb[div]
            topa = a["top"][div] if div < len(a["top"]) else {}
            topb = b["top"][div] if div < len(b["top"]) else {}
            gap_a = topa.get(ta_i, math.inf) - topa.get(tb_i, -math.inf)
            gap_b = topb.get(tb_i, math.inf) - topb.get(ta_i, -math.inf)
            rec.update(a_token=ta_i, b_token=tb_i, gap_a=gap_a if math.isfinite(gap_a) else None,
                       gap_b=gap_b if math.isfinite(gap_b) else None)
            if math.isfinite(gap_a) and math.isfinite(gap_b) and gap_a <= near_tie_tol and gap_b <= near_tie_tol:
                rec["kind"] = "near-tie"
                near.append(rec)
                continue
        else:
            rec["kind"] = "length"
        rec.setdefault("kind", "mismatch")
        mismatches += 1
        diverged.append(rec)
    total = sum(len(a["tokens"]) for a in ref)
    exact = (mismatches == 0 and not near and identical == len(ref) == len(other) and max_d == 0.0 and max_dk == 0.0
             and (expected_tokens is None or all(len(a["tokens"]) == expected_tokens for a in ref + other)))
    return {
        "prompts": len(ref), "tokens_per_prompt": expected_tokens, "tokens_total": total,
        "tokens_compared": compared, "identical_prompts": identical, "mismatches": mismatches,
        "near_ties": near, "mismatch_details": diverged, "first_divergence": first,
        "max_abs_dlogprob": max_d, "max_abs_dlogprob_topk": max_dk,
        "dlogprob_hist": {"labels": list(DLOGPROB_LABELS), "counts": hist}, "missing_logprobs": missing_lp,
        "near_tie_tol": near_tie_tol, "exact": exact,
    }
