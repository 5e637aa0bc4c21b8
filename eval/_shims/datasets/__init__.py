"""Stand-in for Hugging Face ``datasets`` on the offline GPU host (see eval/bench_sweep.py).

``sglang.bench_serving`` imports ``load_dataset`` at module level for its MMMU dataset only;
the A/B harness uses ``--dataset-name random-ids``, which never calls it.
"""


def load_dataset(*args, **kwargs):
    raise RuntimeError("Hugging Face `datasets` is not installed here (eval/_shims stand-in): "
                       "only bench_serving's random / random-ids datasets work")
