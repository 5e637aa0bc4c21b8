"""Reports of the A/B harness (``eval/ab/``): JSON, Markdown, PNG, stdout table.

Works from the result dict alone, so ``python -m eval.ab --render FILE.json`` re-draws the
Markdown and PNG of a committed result; nothing here starts a server.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional

from eval import report


def bench_rows(arm: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
    """batch -> ``sglang.bench_serving`` result of one server record (batches that produced one)."""
    return {int(e["batch"]): e["result"] for e in (arm or {}).get("bench", []) if e.get("result")}


def rates_rows(arm: Dict[str, Any]) -> Dict[int, Dict[str, Any]]:
    """batch -> the client's rate beside SGLang's decode rate at a full batch and the client-path flag
    (``eval/ab/decode_rate.py``, judged by its rule of now from the run's bench_serving result), for the runs
    that recorded them."""
    from eval.ab.decode_rate import rejudge

    # runs recorded before the full batch was: their concurrency (eval.ab took it as the full batch then)
    return {int(e["batch"]): rejudge(dict(e["rates"], full_batch=e["rates"].get("full_batch") or int(e["batch"])),
                                     e.get("result"))
            for e in (arm or {}).get("bench", []) if e.get("rates")}


def _bound(rates: Dict[str, Any]) -> str:
    f = rates.get("client_path_bound")
    if f is None:
        return "not judged" if rates.get("client_path_not_judged") else "—"
    return f"**yes** ({report.fmt(rates.get('client_to_decode'), 2)})" if f else "no"


def _decode(rates: Dict[str, Any], bs: int) -> Any:
    """SGLang's decode rate, with the batch it was read at where the server's running cap made that smaller."""
    x, fb = rates.get("decode_tok_s"), rates.get("full_batch", bs)
    return f"{report.fmt(x, 0)} (at {fb})" if report.is_number(x) and fb != bs else x


def _labels(res: Dict[str, Any]) -> List[str]:
    s = res.get("summary", {})
    a, b = s.get("a"), s.get("b")
    return [x for x in (a, b) if x]


def speed_table(res: Dict[str, Any]) -> str:
    labels = _labels(res)
    arms = res["arms"]
    if len(labels) < 2:
        a = labels[0]
        q = rates_rows(arms[a])
        rows = [[bs, r.get("output_throughput"), (q.get(bs) or {}).get("decode_tok_s"), _bound(q.get(bs) or {}),
                 r.get("median_tpot_ms"), r.get("p99_tpot_ms"),
                 r.get("median_itl_ms"), r.get("p99_itl_ms"), r.get("median_ttft_ms"), r.get("accept_length")]
                for bs, r in sorted(bench_rows(arms[a]).items())]
        return report.markdown_table(["batch", "tok/s", "decode tok/s (SGLang, full batch)", "client-path bound",
                                      "TPOT p50 ms", "TPOT p99 ms", "ITL p50 ms", "ITL p99 ms",
                                      "TTFT p50 ms", "accept len"], rows)
    a, b = labels
    ra, rb = bench_rows(arms[a]), bench_rows(arms[b])
    qa, qb = rates_rows(arms[a]), rates_rows(arms[b])
    by = res["summary"].get("by_batch", {})
    rows = []
    for bs in sorted(set(ra) | set(rb)):
        x, y = ra.get(bs, {}), rb.get(bs, {})
        u, v = qa.get(bs, {}), qb.get(bs, {})
        s = by.get(bs) or by.get(str(bs)) or {}
        rows.append([bs, x.get("output_throughput"), y.get("output_throughput"), _r(s.get("throughput_ratio")),
                     _decode(u, bs), _decode(v, bs), _r(s.get("decode_rate_ratio")),
                     f"{a}: {_bound(u)}, {b}: {_bound(v)}" if u or v else "—",
                     x.get("median_tpot_ms"), y.get("median_tpot_ms"), _r(s.get("tpot_speedup")),
                     x.get("median_itl_ms"), y.get("median_itl_ms"),
                     x.get("p99_itl_ms"), y.get("p99_itl_ms"), x.get("median_ttft_ms"), y.get("median_ttft_ms"),
                     x.get("accept_length"), y.get("accept_length")])
    return report.markdown_table(
        ["batch", f"{a} tok/s", f"{b} tok/s", f"{b}/{a}", f"{a} decode tok/s", f"{b} decode tok/s",
         f"decode {b}/{a}", "client-path bound", f"{a} TPOT p50 ms", f"{b} TPOT p50 ms", "TPOT speedup",
         f"{a} ITL p50", f"{b} ITL p50", f"{a} ITL p99", f"{b} ITL p99", f"{a} TTFT p50", f"{b} TTFT p50",
         f"{a} accept", f"{b} accept"], rows)


def _r(x: Any) -> Any:
    return report.fmt(x, 3) if report.is_number(x) else x


def server_table(res: Dict[str, Any]) -> str:
    rows = []
    servers = dict(res.get("arms", {}))
    servers.update(res.get("extra_servers", {}))
    for label, p in servers.items():
        f = p.get("facts") or {}
        after = p.get("server_info_after") or {}
        sd = p.get("shutdown") or {}
        rows.append([label, p.get("launcher", ""), p.get("status", ""), p.get("startup_s"),
                     f.get("max_running_requests"), f.get("token_capacity"),
                     p.get("peak_gpu_mem_own_mib") or p.get("peak_gpu_mem_mib"),
                     after.get("avg_spec_accept_length"), _yn(p.get("random_weights_confirmed")),
                     _yn(p.get("replayssm_active")), p.get("retracted_reqs"),
                     f"{sd.get('how', '—')} {sd.get('seconds', '')}".strip()])
    return report.markdown_table(["server", "launcher", "status", "startup s", "max running reqs", "token capacity",
                                  "peak GPU MiB (own processes)", "accept len", "random weights", "replayssm log",
                                  "retracted reqs", "shutdown"],
                                 rows, align=["l", "l", "l"] + ["r"] * 5 + ["l"] * 2 + ["r", "l"])


def prefix_section(res: Dict[str, Any]) -> Optional[str]:
    """Prefix caching (``--workload shared-prefix``): per batch, each arm's cache hit rate (its server's Prefill
    batch lines), TTFT p50 / p99 and output tok/s; then each server's prefix-hit requests against the same
    requests on a flushed cache.  None for a run without either."""
    s = res.get("summary", {})
    arms = res.get("arms", {})
    labels = _labels(res)
    pc = {lab: {int(e["batch"]): e["prefix_cache"] for e in arms.get(lab, {}).get("bench", []) if e.get("prefix_cache")}
          for lab in labels}
    pp = s.get("prefix_parity") or {}
    if not any(r.get("hit_rate") is not None for rows in pc.values() for r in rows.values()) and not pp:
        return None
    rows = []
    by = s.get("by_batch", {})
    for bs in sorted({b for rows_ in pc.values() for b in rows_}):
        sb = by.get(bs) or by.get(str(bs)) or {}
        for lab in labels:
            r, q = (pc.get(lab) or {}).get(bs, {}), bench_rows(arms.get(lab, {})).get(bs, {})
            rows.append([bs, lab, report.fmt(r.get("hit_rate"), 3), r.get("cached_tokens"), r.get("new_tokens"),
                         q.get("median_ttft_ms"), q.get("p99_ttft_ms"), q.get("output_throughput")])
        if len(labels) == 2:
            rows.append([bs, f"{labels[1]}/{labels[0]}", _r(sb.get("hit_rate_ratio")), "", "",
                         _r(sb.get("ttft_p50_ratio")), _r(sb.get("ttft_p99_ratio")), _r(sb.get("throughput_ratio"))])
    out = [report.markdown_table(["batch", "server", "cache hit rate", "cached tokens", "computed tokens",
                                  "TTFT p50 ms", "TTFT p99 ms", "output tok/s"], rows)] if rows else []
    for lab, par in pp.items():
        if par:
            out.append(f"\n**{lab}: prefix-hit requests vs the same requests on a flushed cache**\n\n"
                       + _parity_lines(par, "cold", "hit"))
    return "\n".join(out)


def _yn(x: Any) -> str:
    return "—" if x is None else ("yes" if x else "no")


def parity_section(res: Dict[str, Any]) -> str:
    s = res.get("summary", {})
    par = s.get("parity") or {}
    lines = []
    if "exact" not in par:
        lines.append(f"Parity not run: {par.get('skipped', 'n/a')}.")
    else:
        lines.append(_parity_lines(par, s.get("a"), s.get("b")))
    for key, what, x, y in (("parity_solo", "Each prompt alone on both servers", s.get("a"), s.get("b")),
                            ("parity_noise_floor", f"{s.get('a')}'s own noise floor: batched vs one prompt at a time",
                             "batched", "solo")):
        p = s.get(key) or {}
        if "exact" in p:
            lines.append(f"\n**{what}** (`--parity-solo`):\n\n" + _parity_lines(p, x, y))
    sv = s.get("spec_vs_nonspec") or {}
    for label, p in sv.items():
        lines.append(f"\n**Speculative vs non-speculative greedy** ({label}, spec server `{p.get('spec_server')}` vs "
                     f"the non-spec stock reference):\n\n" + _parity_lines(p, "non-spec", label))
    return "\n".join(lines)


def _parity_lines(par: Dict[str, Any], a: Optional[str], b: Optional[str]) -> str:
    head = [
        ("prompts x generated tokens", f"{par['prompts']} x {par.get('tokens_per_prompt')}"),
        ("tokens compared (up to each first divergence)", par["tokens_compared"]),
        ("identical prompts", f"{par['identical_prompts']} / {par['prompts']}"),
        ("token mismatches (prompts diverging, near-ties excluded)", par["mismatches"]),
        ("near-ties (logged, excluded)", len(par.get("near_ties", []))),
        ("max abs dlogprob, chosen token", report.fmt(par["max_abs_dlogprob"], 3)),
        ("max abs dlogprob, shared top-k", report.fmt(par["max_abs_dlogprob_topk"], 3)),
        ("exact", "yes" if par.get("exact") else "no"),
    ]
    out = [report.markdown_table(["", f"{b} vs {a}"], head, align=["l", "r"])]
    h = par.get("dlogprob_hist") or {}
    if h:
        out.append("\nChosen-token |Δlogprob| over the compared prefix (tokens per bin):\n")
        out.append(report.markdown_table(h["labels"], [h["counts"]], align=["r"] * len(h["labels"])))
    details = (par.get("near_ties") or []) + (par.get("mismatch_details") or [])
    if details:
        rows = [[d.get("kind"), d.get("prompt"), d.get("pos"), d.get("a_token"), d.get("b_token"),
                 d.get("gap_a"), d.get("gap_b")] for d in details[:20]]
        out.append("\nDivergences (first per prompt):\n")
        out.append(report.markdown_table(["kind", "prompt", "position", f"{a} token", f"{b} token",
                                          f"{a} top gap", f"{b} top gap"], rows))
    return "\n".join(out)


def profile_section(res: Dict[str, Any]) -> Optional[str]:
    """Per profiled batch, the arms' kernel time per step by group side by side (None when no arm has a
    ``profiles`` record).  Each traced run is an extra bench_serving run at that batch, not a speed result."""
    from eval import profile_trace

    arms = res.get("arms", {})
    by_batch: Dict[Any, Dict[str, Dict[str, Any]]] = {}
    for label in _labels(res):
        for p in arms[label].get("profiles") or []:
            by_batch.setdefault(p.get("batch"), {})[label] = p
    if not by_batch:
        return None
    out = []
    for batch, prof in by_batch.items():
        out.append(f"### batch {batch}\n")
        done = {k: p for k, p in prof.items() if p.get("by_group")}
        for label, p in prof.items():
            if label not in done:
                out.append(f"- {label}: no profile ({p.get('skipped') or p.get('error') or 'no trace'})")
        if len(done) == 2:
            (la, pa), (lb, pb) = done.items()
            heads = ["kernel group", f"{la} µs/step", f"{lb} µs/step", f"{lb} − {la}"]
            if pa.get("decode_steps") and pb.get("decode_steps"):
                na, nb = pa["step_split"], pb["step_split"]
                rows = [[g, report.fmt(x, 1), report.fmt(y, 1), report.fmt(d, 1)]
                        for g, x, y, d in profile_trace.compare_groups(pa["decode_steps"], pb["decode_steps"],
                                                                       profile_trace.DECODE_WALL)]
                out.append(f"Decode steps only ({la}: {na['decode']} of {na['steps']} whole steps, "
                           f"{lb}: {nb['decode']} of {nb['steps']}; the others ran a prefill):\n")
                out.append(report.markdown_table(heads, rows))
                out.append("\nWhole traced window (prefill steps included, divided by the steps asked for):\n")
            rows = [[g, report.fmt(x, 1), report.fmt(y, 1), report.fmt(d, 1)]
                    for g, x, y, d in profile_trace.compare_groups(pa, pb)]
            out.append(report.markdown_table(heads, rows))
        else:
            for label, p in done.items():
                rows = [[g, report.fmt(us, 1)] for g, us in p["by_group"].items()]
                out.append(f"\n{label}:\n\n" + report.markdown_table(["kernel group", "µs/step"], rows))
        for label, p in done.items():
            sp = p.get("step_split") or {}
            split = (f" ({sp['skipped']})" if sp.get("skipped") else
                     f" ({sp['decode']} whole decode and {sp['prefill']} prefill steps)" if sp.get("steps")
                     else " (no whole steps found)" if sp else "")
            out.append(f"\n- {label}: {p.get('steps')} steps{split} from {p.get('delay_s')} s into the run; GPU busy "
                       f"{report.fmt(100 * (p.get('busy_fraction') or 0), 1)}% of the traced span; trace "
                       f"`{p.get('trace')}`; largest kernels: "
                       + "; ".join(f"{t['name'][:60]} {report.fmt(t['us_per_step'], 1)} µs"
                                   for t in p.get("top", [])[:5]))
        out.append("")
    return "\n".join(out)


def markdown(res: Dict[str, Any]) -> str:
    s = res.get("summary", {})
    m = res.get("model", {})
    gpu = res.get("gpu", {})
    info = {
        "comparison": res.get("comparison"),
        "verdict": s.get("verdict", ""),
        "git commit": res.get("git_commit"),
        "SGLang": str(res.get("sglang_version")),
        "GPU": f"{gpu.get('name')} (driver {gpu.get('driver')})",
        "started": f"{res.get('started')} (wall {res.get('wall_s')} s)",
        "model": f"{m.get('name')}: {m.get('source')}" + (f" — {m['notes']}" if m.get("notes") else ""),
        "weights": "dummy + scaled random (eval/weights.py), same seed on every server"
        if (res.get("flags", {}).get("harness", {}) or {}).get("random_weights") else "as loaded",
        "bench": f"{res.get('bench', {}).get('tool')} {res.get('bench', {}).get('dataset')}, "
                 f"input {res.get('bench', {}).get('input_len')}, output {res.get('bench', {}).get('output_len')}, "
                 f"prompts per batch {res.get('bench', {}).get('prompts_per_batch')}"
                 + "".join(f", {k.replace('_', ' ')} {res['bench'][k]}" for k in ("workload", "stream_interval", "clients")
                           if (res.get("bench") or {}).get(k) not in (None, "none"))
                 + (" (each streamed event carries that many tokens; bench_serving spreads an event's gap over its "
                    "tokens: ITL, TPOT and tok/s are per token)"
                    if int((res.get("bench") or {}).get("stream_interval") or 1) > 1 else ""),
    }
    harness = res.get("flags", {}).get("harness", {}) or {}
    info["servers"] = ("started back to back (--concurrent-start: each once the one before had allocated its memory "
                       "pools), measured one at a time while the others idled"
                       if harness.get("concurrent_start") else "started, measured and stopped one after another")
    if len(res.get("calls") or []) > 1:  # python -m eval.ab --resume: the servers ran in more than one call
        info["calls"] = "; ".join(f"{c.get('started')} on {c.get('host')} ({(c.get('gpu') or {}).get('name')}, "
                                  f"git {str(c.get('git_commit'))[:12]}): {', '.join(c.get('servers') or []) or 'none'}"
                                  for c in res["calls"]) + " (stopped and resumed: --resume)"
    if res.get("env_inherited"):
        info["settings from the caller's environment"] = ", ".join(f"{k}={v}" for k, v in res["env_inherited"].items())
    if res.get("annotated_after_run"):
        info["annotated"] = res["annotated_after_run"]
    if res.get("note_shared_baseline"):
        info["note"] = res["note_shared_baseline"]
    sections = [("Run", report.markdown_kv(info)),
                ("Speed (sglang.bench_serving)", speed_table(res)),
                ("Servers", server_table(res)),
                ("Parity (greedy, same prompts)", parity_section(res))]
    pre = prefix_section(res)
    if pre:
        sections.append(("Prefix caching (server hit rate from its Prefill batch lines, TTFT)", pre))
    prof = profile_section(res)
    if prof:
        sections.append(("GPU kernel time per forward step (torch profiler, eval/profile_trace.py)", prof))
    cmds = []
    for label, p in {**res.get("arms", {}), **res.get("extra_servers", {})}.items():
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (p.get("env") or {}).items())
        cmds.append(f"# {label}\n{env + ' ' if env else ''}{p.get('command', '')}")
        bench = [e for e in p.get("bench", []) if e.get("command")]
        if bench:
            cmds.append(bench[0]["command"] + f"   # one per batch size: {[e['batch'] for e in bench]}")
    sections.append(("Commands", "```\n" + "\n".join(cmds) + "\n```"))
    return _doc(res.get("comparison", "A/B"), m.get("name"), sections)


def _doc(title: str, model: Optional[str], sections) -> str:
    parts = [f"# A/B {model}: {title}", ""]
    for heading, body in sections:
        parts += [f"## {heading}", "", body.rstrip(), ""]
    return "\n".join(parts)


def panels(res: Dict[str, Any]) -> List[Dict[str, Any]]:
    labels = _labels(res)
    arms = res["arms"]
    s = res.get("summary", {})
    out = []
    if len(labels) == 2:
        by = s.get("by_batch", {})
        bs = sorted(int(k) for k in by)
        get = lambda k: [(by.get(b) or by.get(str(b)) or {}).get(k) for b in bs]  # noqa: E731
        out.append({"title": f"{labels[1]} / {labels[0]}", "xlabel": "batch (max concurrency)",
                    "ylabel": "ratio", "xlog2": True, "hline": 1.0,
                    "series": [{"label": "output tokens/s ratio", "x": bs, "y": get("throughput_ratio")},
                               {"label": "TPOT p50 speedup", "x": bs, "y": get("tpot_speedup"), "style": "--"}]})
    series = []
    for label in labels:
        rows = bench_rows(arms[label])
        b = sorted(rows)
        series.append({"label": label, "x": b, "y": [rows[x].get("output_throughput") for x in b]})
    out.append({"title": "output tokens/s (bench_serving)", "xlabel": "batch (max concurrency)",
                "ylabel": "tokens/s", "xlog2": True, "series": series})
    par = s.get("parity") or {}
    h = par.get("dlogprob_hist")
    bars = []
    if h:
        bars.append({"label": f"{labels[-1]} vs {labels[0]}", "y": h["counts"]})
    for label, p in (s.get("spec_vs_nonspec") or {}).items():
        if p.get("dlogprob_hist"):
            bars.append({"label": f"{label} spec vs non-spec", "y": p["dlogprob_hist"]["counts"]})
    exact = par.get("exact")
    out.append({"kind": "bar", "title": "parity: |Δlogprob| per token" + (" (exact)" if exact else ""),
                "xlabel": "|Δlogprob| bin (nats)", "ylabel": "tokens", "ylog": True,
                "categories": (h or {}).get("labels", []), "series": bars, "xrotation": 30,
                "empty_text": f"parity not run: {par.get('skipped', 'n/a')}"})
    return out


def write_all(res: Dict[str, Any], out_dir, stem: str, with_json: bool = True) -> List[Path]:
    out_dir = Path(out_dir)
    paths = [report.write_json(out_dir / f"{stem}.json", res)] if with_json else []
    md = out_dir / f"{stem}.md"
    md.write_text(markdown(res))
    paths.append(md)
    png = out_dir / f"{stem}.png"
    m = res.get("model", {}).get("name")
    title = f"{m}: {res.get('comparison')} — {res.get('summary', {}).get('verdict', '')}"[:160]
    if report.plot_panels(png, panels(res), suptitle=title):
        paths.append(png)
    return paths


def render(path) -> str:
    """Re-write the .md and .png beside a result JSON (``.json`` or ``.json.gz``, left as it is);
    returns a one-line status."""
    p = Path(path)
    res = report.read_json(p)
    stem = p.name[:-len(".json.gz")] if p.name.endswith(".json.gz") else p.stem
    written = write_all(res, p.parent, stem, with_json=False)
    return f"{p}: {', '.join(x.name for x in written)}"


def stdout_summary(run: Dict[str, Any], pairs, args) -> str:
    rows = []
    for ph in run["phases"]:
        b = bench_rows(ph)
        tps = " ".join(f"{k}:{report.fmt(v.get('output_throughput'), 0)}" for k, v in sorted(b.items()))
        rows.append([ph["label"], ph.get("status"), ph.get("startup_s"),
                     (ph.get("facts") or {}).get("max_running_requests"), ph.get("peak_gpu_mem_mib"), tps or "—"])
    heads = ["server", "status", "startup s", "max running", "peak MiB", "tok/s by batch"]
    lines = ["", report.text_table(heads, rows)]
    return "\n".join(lines)
