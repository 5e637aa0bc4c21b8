import json, urllib.request, urllib.error
B = "http://127.0.0.1:30123"
def post(path, body):
    req = urllib.request.Request(B + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()[:600]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:600]
    except Exception as e:
        return None, repr(e)
sp = {"max_new_tokens": 4, "temperature": 0}
cases = [
 ("/generate", {"input_ids": [-1, 3], "sampling_params": sp}),
 ("/generate", {"input_ids": [3, 10**9], "sampling_params": sp}),
 ("/generate", {"input_ids": [[1, 2], [3, -5]], "sampling_params": sp}),
 ("/generate", {"input_ids": [True, 3], "sampling_params": sp}),
 ("/generate", {"input_ids": [1, 2.5], "sampling_params": sp}),
 ("/generate", {"input_ids": [1, "3"], "sampling_params": sp}),
 ("/generate", {"input_ids": [1, None], "sampling_params": sp}),
 ("/generate", {"input_ids": [[1, 2], 3], "sampling_params": sp}),
 ("/generate", {"input_ids": [3, [1, 2]], "sampling_params": sp}),
 ("/generate", {"input_ids": [[[1]]], "sampling_params": sp}),
 ("/generate", {"input_ids": [[1], []], "sampling_params": sp}),
 ("/generate", {"input_ids": [-1, 3], "sampling_params": sp, "stream": True}),
 ("/v1/completions", {"model": "x", "prompt": [-1, 3], "max_tokens": 4}),
 ("/v1/completions", {"model": "x", "prompt": [[1, 2], [3, 10**9]], "max_tokens": 4}),
 ("/v1/completions", {"model": "x", "prompt": [-1, 3], "max_tokens": 4, "stream": True}),
 ("/generate", {"input_ids": [1, 1024], "sampling_params": sp}),
 ("/generate", {"input_ids": [0, 1023], "sampling_params": sp}),
 ("/generate", {"input_ids": [1, 2, 3], "sampling_params": sp}),
 ("/generate", {"input_ids": [[1, 2], [3, 4]], "sampling_params": sp}),
 ("/v1/completions", {"model": "x", "prompt": [1, 2, 3], "max_tokens": 4}),
]
out = []
for path, body in cases:
    s, t = post(path, body)
    out.append({"path": path, "body": body, "status": s, "resp": t})
    print(json.dumps(out[-1]))
