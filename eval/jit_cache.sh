#!/usr/bin/env bash
# Warm JIT caches for the GPU host, small enough to carry (the device tool's 64 MiB includes the SGLang bundle).
#   bash eval/jit_cache.sh restore            # before sourcing .sglang-bundle/bootstrap.sh: unpacks
#                                             # .sglang-bundle/jitcache/*.txz into $SGLANG_CACHE_ROOT
#   bash eval/jit_cache.sh save <dir>         # after a run: <dir>/jit-triton.txz (Triton, without its text IRs:
#                                             # a cache hit needs each kernel's .json, .cubin and launcher .so)
#                                             # and <dir>/jit-other.txz (FlashInfer / tvm-ffi builds, xz: ~1/3 of gzip)
#                                             # and <dir>/jit-home.txz (SGLang's FlashInfer autotune results,
#                                             # $HOME/.cache/sglang: re-tuned at every start when missing)
# Copy the saved files into .sglang-bundle/jitcache/ for the next call (restore unpacks every *.txz there; the
# bundle's bootstrap restores *.tgz).
set -uo pipefail
root="${SGLANG_CACHE_ROOT:-/tmp/sglang-cache}"
case "${1:-}" in
  restore)
    mkdir -p "$root"
    for a in .sglang-bundle/jitcache/*.txz; do
      dest="$root"; [ "$(basename "$a")" = jit-home.txz ] && dest="$HOME" && mkdir -p "$HOME"
      [ -f "$a" ] && xz -dc "$a" | tar -C "$dest" -xf - && echo "jit_cache: restored $a"
    done
    ;;
  save)
    out="${2:?usage: eval/jit_cache.sh save <dir>}"
    mkdir -p "$out"
    # xz: the device tool returns files of at most 16 MiB (a server's Triton cache is ~21 MiB as gzip)
    # each written beside as .part and moved into place once whole: a call cut while xz runs keeps the earlier file
    [ -d "$root/triton" ] && tar -C "$root" -cf - --exclude='*.llir' --exclude='*.ptx' --exclude='*.ttir' \
      --exclude='*.ttgir' --exclude='*.source' triton | xz -6 -T0 > "$out/jit-triton.txz.part" \
      && mv "$out/jit-triton.txz.part" "$out/jit-triton.txz"
    others=$(cd "$root" && ls -d flashinfer tvm-ffi 2>/dev/null)
    [ -n "$others" ] && tar -C "$root" -cf - $others | xz -6 -T0 > "$out/jit-other.txz.part" \
      && mv "$out/jit-other.txz.part" "$out/jit-other.txz"
    [ -d "$HOME/.cache/sglang" ] && tar -C "$HOME" -cf - .cache/sglang | xz -6 -T0 > "$out/jit-home.txz.part" \
      && mv "$out/jit-home.txz.part" "$out/jit-home.txz"
    ls -la "$out"/jit-* 2>/dev/null
    ;;
  *) echo "usage: bash eval/jit_cache.sh restore | save <dir>" >&2; exit 2 ;;
esac
