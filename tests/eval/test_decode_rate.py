"""SGLang's decode rate from its scheduler log beside the client's rate, and the client-path-bound flag
(eval/ab/decode_rate.py): parsed from a real server log excerpt (Nemotron-H-8B on the H200, batch 256)."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval.ab import decode_rate  # noqa: E402

# eval/results/e2e-h200/decode-nemotron-h-8b-single-wave-1024/server-staged.log.gz, lines 360-368 and the
# wave's tail (the first decode line after a prefill carries the prefill's seconds in its gap)
EXCERPT = """\
[2026-11-30 18:47:00] Prefill batch, #new-seq: 64, #new-token: 8192, #cached-token: 0, full token usage: 0.01, mamba usage: 0.54, #running-req: 169, #queue-req: 0, #pending-token: 2944, cuda graph: False, input throughput (token/s): 23762.22
[2026-11-30 18:47:00] Prefill batch, #new-seq: 23, #new-token: 2944, #cached-token: 0, full token usage: 0.01, mamba usage: 0.54, #running-req: 233, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 41513.74
[2026-11-30 18:47:01] Decode batch, #running-req: 256, #full token: 43008, full token usage: 0.01, mamba num: 256, mamba usage: 0.54, cuda graph: True, gen throughput (token/s): 3231.96, #queue-req: 0
[2026-11-30 18:47:02] Decode batch, #running-req: 256, #full token: 53248, full token usage: 0.01, mamba num: 256, mamba usage: 0.54, cuda graph: True, gen throughput (token/s): 16242.57, #queue-req: 0
[2026-11-30 18:47:02] Decode batch, #running-req: 256, #full token: 63488, full token usage: 0.02, mamba num: 256, mamba usage: 0.54, cuda graph: True, gen throughput (token/s): 15913.24, #queue-req: 0
[2026-11-30 18:47:03] Decode batch, #running-req: 256, #full token: 73728, full token usage: 0.02, mamba num: 256, mamba usage: 0.54, cuda graph: True, gen throughput (token/s): 16193.68, #queue-req: 0
[2026-11-30 18:47:04] Decode batch, #running-req: 256, #full token: 83968, full token usage: 0.02, mamba num: 256, mamba usage: 0.54, cuda graph: True, gen throughput (token/s): 15810.60, #queue-req: 0
[2026-11-30 18:47:30] Decode batch [1234], #running-req: 240, #full token: 280000, full token usage: 0.08, mamba num: 240, mamba usage: 0.50, cuda graph: True, gen throughput (token/s): 15500.00, #queue-req: 0
[2026-11-30 18:47:31] Decode batch, #running-req: 120, #full token: 140000, full token usage: 0.04, mamba num: 120, mamba usage: 0.25, cuda graph: True, gen throughput (token/s): 9000.00, #queue-req: 0
"""


def test_decode_lines_of_a_real_log_excerpt():
    lines = decode_rate.decode_lines(EXCERPT)
    assert len(lines) == 7  # the prefill lines are not decode lines; "Decode batch [iter]" is one
    assert lines[0] == (256, 3231.96) and lines[-2] == (240, 15500.0) and lines[-1] == (120, 9000.0)


def test_full_batch_rate_keeps_lines_from_90_percent_of_the_batch():
    lines = decode_rate.decode_lines(EXCERPT)
    rate, n = decode_rate.full_batch_rate(lines, 256)
    # 231 running requests or more: the five 256 lines and the 240 one; the median sheds the prefill-tainted line
    assert n == 6 and rate == pytest.approx((15810.60 + 15913.24) / 2)
    assert decode_rate.min_full_batch(256) == 231 and decode_rate.min_full_batch(1) == 1
    assert decode_rate.full_batch_rate(lines, 512) == (None, 0)  # the batch never filled
    assert decode_rate.full_batch_rate(lines, 128)[1] == 7


def test_client_path_flag():
    # the run: the client saw 35.4 ms TPOT at 256 requests (7.2k tok/s) while the scheduler decoded ~15.9k
    bench = {"output_throughput": 6897.0, "median_tpot_ms": 35.4}
    r = decode_rate.rates(EXCERPT, bench, 256)
    assert r["client_tok_s"] == 6897.0 and r["client_full_batch_tok_s"] == pytest.approx(256e3 / 35.4)
    assert r["client_to_decode"] == pytest.approx(256e3 / 35.4 / r["decode_tok_s"]) and r["client_path_bound"] is True
    # a client that keeps up: 256 / 16.2 ms = 15.8k, within 10% of the decode rate
    ok = decode_rate.rates(EXCERPT, {"output_throughput": 14000.0, "median_tpot_ms": 16.2}, 256)
    assert ok["client_path_bound"] is False
    assert decode_rate.check(100.0, 111.2) == (pytest.approx(100 / 111.2), True)
    assert decode_rate.check(100.0, 109.0)[1] is False
    assert decode_rate.check(120.0, 100.0)[1] is True  # a disagreement either way
    # the median inter-token gap wins over TPOT: TPOT also holds other requests' prefills (the 8B 1024/1024 x2
    # run: TPOT 21.33 ms, ITL 17.05 ms per token, scheduler ~15.9k here): not flagged
    both = {"output_throughput": 9823.0, "median_tpot_ms": 21.33, "median_itl_ms": 17.05}
    r2 = decode_rate.rates(EXCERPT, both, 256)
    assert r2["client_full_batch_tok_s"] == pytest.approx(256e3 / 17.05) and r2["client_rate_from"] == "median_itl_ms"
    assert r2["client_path_bound"] is False
    assert r["client_rate_from"] == "median_tpot_ms"  # no ITL in the result: TPOT
    # a capped stream: its chunks arrive late, the gaps spread over their tokens are long: flagged
    assert decode_rate.rates(EXCERPT, dict(both, median_itl_ms=35.4), 256)["client_path_bound"] is True
    for bad in (0, -1.0, None, True, "17"):  # not a latency: the next one is read
        assert decode_rate.client_full_batch_rate({"median_itl_ms": bad, "median_tpot_ms": 20.0}, 256) == \
            pytest.approx(256e3 / 20.0)
    # re-judging a recorded run by the rule of now; one recorded before the full batch was is left as recorded
    old = dict(r, client_path_bound=True)
    assert decode_rate.rejudge(old, both)["client_path_bound"] is False
    no_fb = {k: v for k, v in old.items() if k != "full_batch"}
    assert decode_rate.rejudge(no_fb, both) == no_fb
    assert decode_rate.client_full_batch_rate(both, 0) is None
    # nothing to compare: no latency, or no full-batch line
    assert decode_rate.rates(EXCERPT, {"output_throughput": 1.0}, 256)["client_path_bound"] is None
    assert decode_rate.rates("", bench, 256)["client_path_bound"] is None


def test_a_server_capped_below_the_concurrency_decodes_its_cap_as_the_full_batch():
    # concurrency 512 on a server that admits 240: the lines from 216 running up, and the client's 240 / TPOT
    bench = {"output_throughput": 9000.0, "median_tpot_ms": 16.0}
    assert decode_rate.rates(EXCERPT, bench, 512)["decode_tok_s"] is None  # no cap known: never filled
    r = decode_rate.rates(EXCERPT, bench, 512, cap=240)
    assert r["full_batch"] == 240 and r["min_running"] == 216
    # the four clean 256 lines and the 240 one; the line right after the prefills is left out
    assert r["decode_tok_s"] == pytest.approx(15913.24) and r["decode_lines"] == 5
    assert r["decode_lines_full_batch"] == 6 and "decode_rate_note" not in r
    assert r["client_full_batch_tok_s"] == pytest.approx(240e3 / 16.0)
    # a cap above the concurrency (or none, or nonsense) leaves the concurrency the full batch
    for cap in (1000, None, 0, "x"):
        assert decode_rate.rates(EXCERPT, bench, 256, cap=cap)["full_batch"] == 256


# eval/results/e2e-h200/spec-nemotron-h-8b-streamchunk (NEXTN, accept 3 of 4, 128 in / 256 out, batch 256, two
# waves): about 85 decode steps a request, so two decode lines a wave, the first after the wave's prefills
SPEC_EXCERPT = """\
[2026-12-03 15:35:43] Prefill batch, #new-seq: 256, #new-token: 32768, #cached-token: 0, full token usage: 0.01, mamba usage: 1.00, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 20000.00
[2026-12-03 15:35:44] Decode batch, #running-req: 256, #full token: 54784, full token usage: 0.01, mamba num: 256, mamba usage: 1.00, accept len: 3.00, accept rate: 0.67, cuda graph: True, gen throughput (token/s): 3077.90, #queue-req: 0
[2026-12-03 15:35:46] Decode batch, #running-req: 256, #full token: 85504, full token usage: 0.02, mamba num: 256, mamba usage: 1.00, accept len: 3.00, accept rate: 0.67, cuda graph: True, gen throughput (token/s): 15128.81, #queue-req: 0
[2026-12-03 15:35:49] Prefill batch, #new-seq: 256, #new-token: 32768, #cached-token: 0, full token usage: 0.01, mamba usage: 1.00, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 20000.00
[2026-12-03 15:35:50] Decode batch, #running-req: 256, #full token: 40855, full token usage: 0.01, mamba num: 256, mamba usage: 1.00, accept len: 3.00, accept rate: 0.67, cuda graph: True, gen throughput (token/s): 6304.06, #queue-req: 0
[2026-12-03 15:35:52] Decode batch, #running-req: 256, #full token: 71575, full token usage: 0.02, mamba num: 256, mamba usage: 1.00, accept len: 3.00, accept rate: 0.67, cuda graph: True, gen throughput (token/s): 15074.77, #queue-req: 0
"""


def test_decode_lines_after_a_prefill_are_left_out():
    # all four lines are at the full batch; the median of all four (10.7k) mixed in the two waves' prefills
    assert decode_rate.full_batch_rate(decode_rate.decode_lines(SPEC_EXCERPT), 256)[0] == \
        pytest.approx((6304.06 + 15074.77) / 2)
    assert decode_rate.decode_only_lines(SPEC_EXCERPT) == [(256, 15128.81), (256, 15074.77)]
    r = decode_rate.rates(SPEC_EXCERPT, {"output_throughput": 9210.8, "median_itl_ms": 17.0}, 256)
    assert r["decode_tok_s"] == pytest.approx((15128.81 + 15074.77) / 2)
    assert (r["decode_lines"], r["decode_lines_full_batch"], r["decode_lines_all"]) == (2, 4, 4)
    assert r["client_path_bound"] is False and "decode_rate_note" not in r
    # a run's first decode line has no known start (the window began before the run): left out too
    assert decode_rate.decode_only_lines(SPEC_EXCERPT.splitlines()[2] + "\n") == []
    # no clean full-batch line at all: every full-batch line is used, and the record says the rate holds prefills
    tainted = "\n".join(SPEC_EXCERPT.splitlines()[:2]) + "\n"
    r2 = decode_rate.rates(tainted, {"output_throughput": 9210.8, "median_itl_ms": 17.0}, 256)
    assert r2["decode_tok_s"] == pytest.approx(3077.90) and "prefill" in r2["decode_rate_note"]
    assert decode_rate.rates("", {"median_itl_ms": 17.0}, 256)["decode_tok_s"] is None


def test_a_workload_that_prefills_while_it_decodes_is_not_judged():
    bench = {"output_throughput": 6897.0, "median_tpot_ms": 35.4}
    r = decode_rate.rates(EXCERPT, bench, 256, judge=False)
    assert r["client_path_bound"] is None and "prefill" in r["client_path_not_judged"]
    assert r["decode_tok_s"] == decode_rate.rates(EXCERPT, bench, 256)["decode_tok_s"]  # both rates still recorded
    assert r["client_to_decode"] == pytest.approx(256e3 / 35.4 / r["decode_tok_s"])


def test_log_window_reads_what_a_run_appended(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("startup\n" + EXCERPT.splitlines()[2] + "\n")
    start = decode_rate.log_offset(log)
    with open(log, "a") as f:
        f.write("\n".join(EXCERPT.splitlines()[3:5]) + "\n")
    window = decode_rate.log_window(log, start)
    assert [x for _, x in decode_rate.decode_lines(window)] == [16242.57, 15913.24]
    assert decode_rate.log_offset(tmp_path / "missing.log") == 0
    gz = tmp_path / "server.log.gz"
    with gzip.open(gz, "wt") as f:
        f.write(EXCERPT)
    assert decode_rate.read_log(gz) == EXCERPT
