"""``tqbridge serve``: a real mlx-lm server process with TQCache layers (SmolLM2 on 127.0.0.1), driven by
a real HTTP client: concurrent chat completions sharing a prefix, streaming and not, batched and all answered;
cached prompt tokens reused; a client that disconnects mid-stream harms no later request; bad options
refused at start in one line."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("mlx.core", reason="MLX is not installed")
pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")

STARTUP_S = 300          # model conversion (once per cache directory) + load on a busy 2-core machine
REQUEST_S = 240          # one chat completion of a few tokens, waiting behind the others
SYSTEM = ("You are a helpful assistant. You answer questions about rivers, mountains and cities in one "
          "short sentence, and you never use lists.")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "tqbridge.tools.cli", *args], capture_output=True, text=True,
                          timeout=120, **kw)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tqbridge.bridge.gguf.models import ModelUnavailable, smollm2_path

    try:
        smollm2_path()
    except ModelUnavailable as e:
        pytest.skip(f"SmolLM2 is not installed: {e}")
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tqbridge.tools.cli", "serve", "smollm2", "--kv", "q8_0/turbo3",
                                 "--host", "127.0.0.1", "--port", str(port), "--max-tokens", "6",
                                 "--log-level", "INFO"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        t0 = time.monotonic()
        last_error = None
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError as e:     # not listening yet: kept for the message below
                last_error = e
            if time.monotonic() - t0 > STARTUP_S:
                pytest.fail(f"the server did not answer /health in {STARTUP_S} s (last: {last_error!r}): "
                            f"{log.read_text()[-2000:]}")
            time.sleep(1)
        yield port, proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _body(question: str, stream: bool, max_tokens: int = 6) -> bytes:
    return json.dumps({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                       "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}).encode()


def _chat(port: int, question: str, stream: bool = False, max_tokens: int = 6) -> dict:
    """One chat completion: {status, text, usage (non-stream), done (stream)}."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_S)
    c.request("POST", "/v1/chat/completions", _body(question, stream, max_tokens),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    if not stream:
        doc = json.loads(raw) if r.status == 200 else {}
        msg = doc.get("choices", [{}])[0].get("message", {})
        return {"status": r.status, "text": msg.get("content"), "usage": doc.get("usage"), "raw": raw}
    text, done = "", False
    for line in raw.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            if data.strip() == "[DONE]":
                done = True
                continue
            delta = json.loads(data)["choices"][0].get("delta", {})
            text += delta.get("content") or ""
    return {"status": r.status, "text": text, "done": done, "raw": raw}


def _cached(resp: dict) -> int:
    return ((resp.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_concurrent_requests_sharing_a_prefix_are_batched_and_all_answered(server):
    """One request first (its system prompt is then stored), then five at once, streaming and not: every
    one answered, each found the shared prefix cached, and the server's log says several sequences
    decoded in one batch (tqbridge serve logs each new largest batch)."""
    port, proc, log = server
    assert _chat(port, "Name a sea in Europe.")["status"] == 200
    jobs = [("Name a river in Africa.", False), ("Name a mountain in Asia.", True),
            ("Name a city in Europe.", False), ("Name a lake in America.", True), ("Name a desert.", False)]
    results: dict = {}
    go_now = threading.Barrier(len(jobs))

    def go(i, q, stream):
        try:
            go_now.wait()
            results[i] = _chat(port, q, stream, max_tokens=16)
        except (OSError, http.client.HTTPException, ValueError, threading.BrokenBarrierError) as e:
            results[i] = {"status": None, "error": repr(e)}   # recorded, asserted below
    threads = [threading.Thread(target=go, args=(i, q, s)) for i, (q, s) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_S * len(jobs))
    assert sorted(results) == list(range(len(jobs))), results
    for i, (q, stream) in enumerate(jobs):
        r = results[i]
        assert r["status"] == 200, (q, r)
        assert r["text"], (q, r)
        if stream:
            assert r["done"], r
        else:
            assert _cached(r) > 0, r     # the system prompt, from the first request's entry
    batched = [int(line.split("tqbridge serve: ")[1].split()[0]) for line in log.read_text().splitlines()
               if "sequences decode in one batch" in line]
    assert batched and max(batched) >= 2, log.read_text()[-3000:]
    assert proc.poll() is None


def test_repeated_requests_reuse_their_prompts_and_answer_the_same(server):
    """Two greedy questions sharing the system prompt, asked A, B, A, B: each later request starts from
    a stored TQCache copy (the server's LRUPromptCache deep-copies and trims them; B's first answer
    writes its question's rows into a copy of A's entry), and each answers as it did the first time."""
    port, _, log = server
    qa, qb = "What is the longest river in Europe?", "Which city stands on the river Thames?"
    first = {q: _chat(port, q) for q in (qa, qb)}
    for q in (qa, qb):
        assert first[q]["status"] == 200 and first[q]["text"], first[q]
    assert _cached(first[qb]) > 0, first[qb]    # the shared system prompt, from A's entry
    for q in (qa, qb):
        r = _chat(port, q)
        assert r["status"] == 200 and r["text"] == first[q]["text"], (first[q], r)
        assert _cached(r) >= first[q]["usage"]["prompt_tokens"] - 1, r
    assert "Prompt Cache:" in log.read_text()


def test_a_client_killed_mid_stream_harms_no_other_request(server):
    """A client reset mid-stream while another request streams beside it (in one batch: the server
    drops the killed one's row from the batch cache): the other one and the requests after it are
    answered."""
    port, proc, _ = server
    beside: dict = {}

    def other():
        try:
            beside.update(_chat(port, "Tell me about the Rhine.", stream=True, max_tokens=48))
        except (OSError, http.client.HTTPException, ValueError) as e:   # recorded, asserted below
            beside["error"] = repr(e)
    t = threading.Thread(target=other)
    t.start()
    s = socket.create_connection(("127.0.0.1", port), timeout=REQUEST_S)
    body = _body("Tell me about the Danube.", True, max_tokens=40)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while b"data: " not in got:   # the stream has begun
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")   # RST on close
    s.close()
    t.join(REQUEST_S)
    assert beside.get("status") == 200 and beside["text"] and beside["done"], beside
    after = [_chat(port, "Name a river in Asia."), _chat(port, "Tell me about the Danube.", stream=True)]
    for r in after:
        assert r["status"] == 200 and r["text"], r
    assert after[1]["done"]
    assert proc.poll() is None


@pytest.mark.parametrize("args,says", [
    (["--kv", "q8_0/nope"], "unknown format 'nope'"),
    (["--kv", "q8_0/turbo3[99=f16/f16]"], None),
    (["--kv-bits", "4"], "--kv-bits"),
    (["--model", "x"], "--model"),
    (["--port", "x"], "--port: not a port number"),
    (["--port=70000"], "is not a port number"),
])
def test_bad_options_are_refused_at_start_in_one_line(args, says):
    r = _cli("serve", "smollm2", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tqbridge serve: error:"), r.stderr
    assert "Traceback" not in r.stderr
    if says:
        assert says in lines[0]


def test_a_directory_without_a_model_or_tokenizer_is_refused_in_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"tqbridge": {"tokenizer_note": "no tokenizer files: SPM"}}))
    for d, says in ((empty, "not an mlx-lm model directory (no config.json)"),
                    (bare, "no tokenizer files, which mlx-lm's server needs (no tokenizer files: SPM)")):
        r = _cli("serve", str(d))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and says in lines[0], r.stderr


def test_a_port_in_use_is_refused_in_one_line_without_hanging():
    """mlx-lm's server alone starts its generation thread, then its bind fails with a traceback and the
    process hangs on that thread; tqbridge serve refuses first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = _cli("serve", "smollm2", "--port", str(taken.getsockname()[1]))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Address already in use" in lines[0], r.stderr
