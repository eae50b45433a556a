"""Python client logic against an in-process fake ROUTER server (no engine):
id matching with interleaved streams, error replies, output order, timeouts.
The real server exercises the same client in the end-to-end tests."""
import json, os, re, sys, threading
try:
    import zmq
except ImportError:
    # Exit 77 = skipped (CTest SKIP_RETURN_CODE); 1 where PAGEDSERVE_ALLOWED_SKIPS
    # (scripts/test: the no-GPU reasons only) does not allow this reason.
    reason = "pyzmq missing (scripts/install-deps)"
    allowed = os.environ.get("PAGEDSERVE_ALLOWED_SKIPS")
    if allowed is not None and not re.search(allowed, reason):
        print("SKIP NOT ALLOWED (PAGEDSERVE_ALLOWED_SKIPS): " + reason); sys.exit(1)
    print("skipped: " + reason); sys.exit(77)
sys.path.insert(0, os.path.join(os.environ.get("PAGEDSERVE_SOURCE_DIR", os.path.dirname(__file__) + "/../.."), "clients/python"))
from pagedserve_client import Client, PagedServeError, PagedServeTimeout

ctx = zmq.Context()
srv = ctx.socket(zmq.ROUTER); port = srv.bind_to_random_port("tcp://127.0.0.1")
def serve():
    pending = []
    while True:
        ident, raw = srv.recv_multipart()
        m = json.loads(raw)
        def send(d): srv.send_multipart([ident, json.dumps({"version": 1, **d}).encode()])
        t = m["type"]
        if t == "quit": return
        if t == "silent": continue
        if t == "health": send({"type": "health", "id": m["id"], "status": "ok"})
        elif t == "stats": send({"type": "stats", "id": m["id"], "num_waiting": 0})
        elif t == "generate":
            if m.get("top_p", 1) > 1:
                send({"type": "error", "id": m["id"], "code": "invalid_request", "message": "top_p must be in (0, 1], got 1.5"}); continue
            if m["stream"]:
                pending.append((m, send))
                if len(pending) == 2:  # interleave two streams
                    for i in range(2):
                        for pm, ps in pending:
                            ps({"type": "delta", "id": pm["id"], "outputs": [{"index": 0, "text": pm["id"][-1] + str(i), "token_ids": [i]}]})
                    for pm, ps in pending:
                        ps({"type": "final", "id": pm["id"], "stream": True, "outputs": [{"index": 0, "finish_reason": "length"}], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "cached_prompt_tokens": 0}})
                    pending.clear()
            else:
                send({"type": "final", "id": m["id"], "stream": False, "outputs": [{"index": 1, "finish_reason": "stop", "text": "b", "token_ids": [2]}, {"index": 0, "finish_reason": "length", "text": "a", "token_ids": [1]}], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "cached_prompt_tokens": 0}})
th = threading.Thread(target=serve, daemon=True); th.start()  # daemon: a failed assert must not hang
with Client(f"tcp://127.0.0.1:{port}", timeout=5) as c:
    assert c.health()
    assert c.stats() == {"num_waiting": 0}
    r = c.generate(messages=[{"role": "user", "content": "hi"}], n=2)
    assert [o.text for o in r.outputs] == ["a", "b"], r
    try:
        c.generate("x", top_p=1.5); assert False
    except PagedServeError as e:
        assert e.code == "invalid_request" and "1.5" in e.message
    s1 = c.stream("p", request_id="A"); s2 = c.stream("q", request_id="B")
    got2 = [d.text for d in s2]; got1 = [d.text for d in s1]
    assert got1 == ["A0", "A1"] and got2 == ["B0", "B1"], (got1, got2)
    assert s1.final.outputs[0].finish_reason == "length" and s1.text() == "A0A1"
    c.timeout = 0.2
    c.send({"type": "silent", "id": "z"})
    try:
        c._next_reply("z"); assert False
    except PagedServeTimeout as e:
        assert e.code == "timeout"
    c.send({"type": "quit"})
th.join(); srv.close(); ctx.term()
print("python client test OK")
