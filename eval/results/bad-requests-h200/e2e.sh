#!/usr/bin/env bash
# e2e: bad token ids against our launcher on the GPU host; the server must answer 400 and survive.
set -uo pipefail
SGLANG_BUNDLE_HTTP=1 source .sglang-bundle/bootstrap.sh >/dev/null 2>&1
EP=$(python3 -m eval.entry_points --dest /tmp/replayssm-ep | tail -1)
export PYTHONPATH="$EP:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
mkdir -p /tmp/models
MODEL=$(python3 -c "from eval import models; print(models.materialize('${MODEL:-tiny-nemotron-h}', root='/tmp/models'))")
echo "model $MODEL"
python3 -m sglang_replayssm.launch_server --model-path "$MODEL" --load-format dummy --mem-fraction-static 0.25 \
  --context-length 2048 --disable-radix-cache --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled \
  --attention-backend flashinfer --port 30123 ${EXTRA:-} > $OUT/server.log 2>&1 &
SP=$!
for i in $(seq 1 240); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:30123/health', timeout=2)" 2>/dev/null && break; kill -0 $SP || break; sleep 1; done
echo "health after ${i}s"
python3 .cache/h1/client.py > $OUT/client.json; echo "client rc $?"
sleep 4; curl_ok=$(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:30123/health', timeout=5).status)" 2>&1 | tail -1); echo "health after requests: $curl_ok"
kill -0 $SP && echo "SERVER ALIVE" || echo "SERVER DEAD"
kill $SP; sleep 3; kill -9 $SP 2>/dev/null
grep -c "Traceback" $OUT/server.log; grep -n "Traceback\|AttributeError\|device-side\|http_server\] Error" $OUT/server.log | cut -c1-200 | tail -30
