"""The client of pagedserve's protocol v1 over ZeroMQ (see docs/protocol.md).

The server binds a ROUTER socket; this client connects a DEALER socket and sends
one JSON object per message. Many requests may be in flight on one client: replies
are matched to requests by id, and replies for other requests are buffered until
someone asks for them. A Client is not thread-safe; use one per thread.

Example::

    from pagedserve_client import Client, PagedServeError

    with Client("tcp://127.0.0.1:5555") as client:
        assert client.health()
        # Streamed: deltas as they are generated.
        stream = client.stream("Write a haiku about paging.", max_tokens=48,
                               temperature=0.7, seed=1)
        for delta in stream:
            print(delta.text, end="", flush=True)
        print("\\n", stream.final.outputs[0].finish_reason, stream.final.usage)
        # Not streamed: one final result; chat messages; n = 2.
        result = client.generate(messages=[{"role": "user", "content": "Hi!"}],
                                 n=2, max_tokens=16)
        for out in result.outputs:
            print(out.index, repr(out.text), out.finish_reason)
        print(client.stats())
        try:
            client.generate("x", top_p=1.5)
        except PagedServeError as e:
            print(e.code, e.message)   # invalid_request top_p must be in (0, 1], got 1.5
        # Prefix-cache isolation: requests with different salts share no KV blocks.
        client.generate("Hello", cache_salt="tenant-a", max_tokens=8)

CurveZMQ (server started with --zmq-curve-secret-key-file, see docs/security.md)::

    server_public, _ = load_certificate("server.key")           # from `pagedserve keygen server`
    my_public, my_secret = load_certificate("client.key_secret")  # listed in the server's folder
    with Client("tcp://10.0.0.5:5555", curve_server_key=server_public,
                curve_public_key=my_public, curve_secret_key=my_secret) as client:
        ...

A client refused at the CURVE handshake (wrong server key, key not authorized)
sees no reply at all: calls raise PagedServeTimeout.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterator, List, Optional

import zmq

PROTOCOL_VERSION = 1
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"


class PagedServeError(Exception):
    """An error reply from the server (code is stable, message is for people)."""

    def __init__(self, code: str, message: str, request_id: Optional[str] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class PagedServeTimeout(PagedServeError):
    def __init__(self, request_id: Optional[str], seconds: float):
        super().__init__("timeout", f"no reply within {seconds:g} s", request_id)


@dataclass
class TokenLogprob:
    token_id: int
    logprob: Optional[float]  # None stands for -inf
    top: List[Dict[str, Any]] = field(default_factory=list)  # [{"token_id", "logprob"}]


@dataclass
class Delta:
    """New output of one sequence of a streamed request."""

    index: int
    text: str
    token_ids: List[int]
    logprobs: List[TokenLogprob] = field(default_factory=list)
    finish_reason: Optional[str] = None


@dataclass
class Output:
    """One sequence in a final message (text/token_ids empty when streamed)."""

    index: int
    finish_reason: str
    text: str = ""
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[TokenLogprob] = field(default_factory=list)
    stop_string: Optional[str] = None
    stop_token_id: Optional[int] = None


@dataclass
class Final:
    request_id: str
    outputs: List[Output]
    usage: Dict[str, int]
    streamed: bool = False
    error: Optional[str] = None
    # prompt_logprobs: entry i scores prompt token i + 1 (token_id, logprob,
    # top; the rank in prompt_ranks[i]).
    prompt_logprobs: List[TokenLogprob] = field(default_factory=list)
    prompt_ranks: List[int] = field(default_factory=list)


def _logprobs(items: Optional[list]) -> List[TokenLogprob]:
    return [TokenLogprob(e["token_id"], e.get("logprob"), e.get("top", [])) for e in items or []]


def _final(msg: dict) -> Final:
    outputs = [
        Output(index=o["index"], finish_reason=o["finish_reason"], text=o.get("text", ""),
               token_ids=o.get("token_ids", []), logprobs=_logprobs(o.get("logprobs")),
               stop_string=o.get("stop_string"), stop_token_id=o.get("stop_token_id"))
        for o in msg["outputs"]
    ]
    return Final(msg.get("id", ""), sorted(outputs, key=lambda o: o.index), msg["usage"],
                 msg.get("stream", False), msg.get("error"), _logprobs(msg.get("prompt_logprobs")),
                 [e["rank"] for e in msg.get("prompt_logprobs") or []])


class Stream:
    """Iterator over the deltas of a streamed generate request.

    After the iteration ends, ``final`` holds the final message and ``text(i)``
    the concatenated text of sequence i. Abort it with ``abort()``; the iteration
    then ends with finish_reason "abort".
    """

    def __init__(self, client: "Client", request_id: str):
        self._client = client
        self.request_id = request_id
        self.final: Optional[Final] = None
        self._texts: Dict[int, List[str]] = collections.defaultdict(list)

    def __iter__(self) -> Iterator[Delta]:
        while self.final is None:
            msg = self._client._next_reply(self.request_id)
            kind = msg["type"]
            if kind == "delta":
                for o in msg["outputs"]:
                    self._texts[o["index"]].append(o["text"])
                    yield Delta(o["index"], o["text"], o["token_ids"], _logprobs(o.get("logprobs")),
                                o.get("finish_reason"))
            elif kind == "final":
                self.final = _final(msg)
            elif kind == "abort_ack":
                continue
            else:
                raise PagedServeError("internal", f"unexpected reply type {kind!r}", self.request_id)

    def text(self, index: int = 0) -> str:
        return "".join(self._texts[index])

    def abort(self) -> None:
        self._client.abort(self.request_id, wait=False)


def _key_bytes(key) -> bytes:
    return key.encode("ascii") if isinstance(key, str) else bytes(key)


def load_certificate(path: str):
    """(public_key, secret_key or None) of a ZeroMQ certificate file (Z85 bytes),
    as written by `pagedserve keygen NAME` (NAME.key, NAME.key_secret)."""
    import zmq.auth  # noqa: PLC0415 (only CURVE users need it)
    return zmq.auth.load_certificate(path)


class Client:
    """A DEALER connection to a pagedserve server.

    timeout: seconds to wait for each reply (None waits forever).
    curve_server_key: the server's Z85 public key (its NAME.key, read with
        load_certificate): talk CurveZMQ. curve_public_key / curve_secret_key:
        this client's Z85 key pair (default: a fresh pair, enough for a server
        without an allow-list of client keys).
    """

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, timeout: Optional[float] = 60.0,
                 context: Optional[zmq.Context] = None, *, curve_server_key: Optional[bytes] = None,
                 curve_public_key: Optional[bytes] = None, curve_secret_key: Optional[bytes] = None):
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if curve_server_key is not None:
            if (curve_public_key is None) != (curve_secret_key is None):
                raise ValueError("give both curve_public_key and curve_secret_key, or neither")
            if curve_public_key is None:
                curve_public_key, curve_secret_key = zmq.curve_keypair()
            self._socket.curve_serverkey = _key_bytes(curve_server_key)
            self._socket.curve_publickey = _key_bytes(curve_public_key)
            self._socket.curve_secretkey = _key_bytes(curve_secret_key)
        elif curve_public_key is not None or curve_secret_key is not None:
            raise ValueError("curve_public_key / curve_secret_key need curve_server_key")
        self._socket.connect(endpoint)
        self.timeout = timeout
        self._pending: Dict[str, Deque[dict]] = collections.defaultdict(collections.deque)
        self._ids = itertools.count(1)
        self._prefix = f"py{os.getpid()}-{id(self) & 0xFFFF:x}-"

    # -- plumbing ---------------------------------------------------------
    def close(self) -> None:
        self._socket.close(0)
        if self._own_context:
            self._context.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._ids)}"

    def send(self, message: dict) -> None:
        """Sends one raw protocol message (version added when missing). Raises
        PagedServeTimeout when the message cannot be queued within `timeout`
        (no connection to the server: e.g. refused at the CURVE handshake)."""
        message = {"version": PROTOCOL_VERSION, **message}
        self._socket.sndtimeo = -1 if self.timeout is None else max(0, int(self.timeout * 1000))
        try:
            self._socket.send(json.dumps(message, ensure_ascii=False).encode("utf-8"))
        except zmq.Again as e:
            raise PagedServeTimeout(message.get("id"), self.timeout or 0.0) from e

    def _next_reply(self, request_id: str) -> dict:
        """The next reply for request_id; raises PagedServeError for an error reply."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self._pending[request_id]:
            wait_ms = None
            if deadline is not None:
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._socket.poll(wait_ms, zmq.POLLIN):
                raise PagedServeTimeout(request_id, self.timeout or 0.0)
            frames = self._socket.recv_multipart()
            try:
                msg = json.loads(frames[-1].decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise PagedServeError("internal", f"server sent invalid JSON: {e}") from e
            if msg.get("version") != PROTOCOL_VERSION:
                raise PagedServeError("unsupported_version", f"server speaks version {msg.get('version')}")
            rid = msg.get("id", "")
            if msg.get("type") == "error" and not rid:
                # An error that could not be tied to a request (e.g. our message was
                # not readable): report it to whoever is waiting.
                raise PagedServeError(msg.get("code", "internal"), msg.get("message", ""), None)
            self._pending[rid].append(msg)
        msg = self._pending[request_id].popleft()
        if not self._pending[request_id]:
            del self._pending[request_id]
        if msg.get("type") == "error":
            raise PagedServeError(msg["code"], msg["message"], request_id)
        return msg

    # -- requests ---------------------------------------------------------
    def _generate_message(self, prompt, prompt_token_ids, messages, stream, request_id, sampling):
        forms = [f for f in (prompt, prompt_token_ids, messages) if f is not None]
        if len(forms) != 1:
            raise ValueError("give exactly one of prompt, prompt_token_ids, messages")
        msg: Dict[str, Any] = {"type": "generate", "id": request_id or self.new_id(), "stream": stream}
        if prompt is not None:
            msg["prompt"] = prompt
        elif prompt_token_ids is not None:
            msg["prompt_token_ids"] = list(prompt_token_ids)
        else:
            msg["messages"] = list(messages)
        msg.update({k: v for k, v in sampling.items() if v is not None})
        return msg

    def stream(self, prompt: Optional[str] = None, *, prompt_token_ids: Optional[List[int]] = None,
               messages: Optional[List[Dict[str, str]]] = None, request_id: Optional[str] = None,
               **sampling) -> Stream:
        """Starts a streamed generate request; iterate the result for Deltas.

        sampling: n, max_tokens, temperature, top_p, top_k, min_p,
        repetition_penalty, presence_penalty, frequency_penalty, seed, stop,
        stop_token_ids, ignore_eos, logprobs; use_beam_search, best_of,
        length_penalty, early_stopping (beam search); and cache_salt (see docs/protocol.md).
        """
        msg = self._generate_message(prompt, prompt_token_ids, messages, True, request_id, sampling)
        self.send(msg)
        return Stream(self, msg["id"])

    def generate(self, prompt: Optional[str] = None, *, prompt_token_ids: Optional[List[int]] = None,
                 messages: Optional[List[Dict[str, str]]] = None, request_id: Optional[str] = None,
                 **sampling) -> Final:
        """A non-streamed generate request; returns the final message."""
        msg = self._generate_message(prompt, prompt_token_ids, messages, False, request_id, sampling)
        self.send(msg)
        while True:
            reply = self._next_reply(msg["id"])
            if reply["type"] == "final":
                return _final(reply)
            if reply["type"] != "abort_ack":
                raise PagedServeError("internal", f"unexpected reply type {reply['type']!r}", msg["id"])

    def abort(self, request_id: str, wait: bool = True) -> None:
        """Aborts an in-flight request. The abort_ack is consumed by whoever reads
        that request's replies; with wait=True (only for requests nobody iterates)
        this call waits for it. Raises PagedServeError not_found for unknown ids."""
        self.send({"type": "abort", "id": request_id})
        if wait:
            while self._next_reply(request_id)["type"] != "abort_ack":
                pass

    def health(self) -> bool:
        rid = self.new_id()
        self.send({"type": "health", "id": rid})
        return self._next_reply(rid).get("status") == "ok"

    def stats(self) -> Dict[str, Any]:
        rid = self.new_id()
        self.send({"type": "stats", "id": rid})
        reply = self._next_reply(rid)
        return {k: v for k, v in reply.items() if k not in ("version", "type", "id")}
