"""SGLang's own hybrid state pool for the seam tests, built one way (the pool seam's init hook runs in it).

``cache_params`` gives the ``Mamba2CacheParams`` a Mamba2 model (``NemotronHConfig``) or a GDN model
(``Qwen3NextConfig``: grouped conv shards q | k | v) hands SGLang; ``hybrid_pool`` builds the
``HybridReqToTokenPool`` on the CPU from them, the scenario's own switches (extra buffer, speculative
decoding, overlap) passed through as SGLang's keyword arguments.
"""

import torch


def cache_params(kind, geom, layers, conv_dtype=torch.bfloat16, conv_kernel=4):
    """``kind`` "mamba2" with ``geom`` (H, P, N, G) or "gdn" with (HK, HV, KD, VD); an fp32 SSM state."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    if kind == "mamba2":
        H, P, N, G = geom
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=H * P, n_groups=G, num_heads=H,
                                        head_dim=P, state_size=N, conv_kernel=conv_kernel)
    elif kind == "gdn":
        HK, HV, KD, VD = geom
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * VD, n_groups=HK, num_heads=HV,
                                        head_dim=VD, state_size=KD, conv_kernel=conv_kernel,
                                        conv_shard_groups=[HK * KD, HK * KD, HV * VD])
    else:
        raise ValueError(f"kind must be mamba2 or gdn, got {kind!r}")
    return Mamba2CacheParams(shape=shape, layers=list(layers),
                             dtype=Mamba2StateDType(conv=conv_dtype, temporal=torch.float32))


def hybrid_pool(params, *, size, mamba_size, mamba_spec_state_size, **sglang_kwargs):
    """``HybridReqToTokenPool`` on the CPU for ``params`` (its layers are the mamba layers)."""
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    return HybridReqToTokenPool(
        size=size, mamba_size=mamba_size, mamba_spec_state_size=mamba_spec_state_size, max_context_len=64,
        device="cpu", enable_memory_saver=False, cache_params=params, mamba_layer_ids=list(params.layers),
        **sglang_kwargs)
