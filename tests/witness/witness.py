"""A small transparency-log witness for the tests, written from C2SP tlog-witness and
tlog-cosignature alone (it shares no code with the ledger): ``POST /add-checkpoint``
verifies the log's signature with the log key it was given, holds the old size to the
largest tree it cosigned (409 with ``text/x.tlog.size`` otherwise), checks the RFC 6962
consistency proof from that tree (422 when it does not verify), and then, atomically,
records the new tree and answers an Ed25519 ``cosignature/v1`` line.

    python -m tests.witness.witness NAME KEY_FILE LOG_VKEY STATE_FILE

prints ``http://127.0.0.1:PORT`` (a free port) and serves until stopped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def consistent(
    first: int, second: int, first_hash: bytes, second_hash: bytes, proof: list[bytes]
) -> bool:
    """RFC 9162, 2.1.4.2, step by step."""
    if first == second:
        return not proof and first_hash == second_hash
    if first == 0:
        return not proof
    if not proof or first > second:
        return False
    if first & (first - 1) == 0:
        proof = [first_hash, *proof]
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = _h(b"\x01" + c + fr), _h(b"\x01" + c + sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = _h(b"\x01" + sr + c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_hash and sr == second_hash and sn == 0


class Witness:
    def __init__(self, name: str, key: Ed25519PrivateKey, log_vkey: str, state: Path) -> None:
        self.name, self.key, self.state = name, key, state
        log_name, log_id, encoded = log_vkey.strip().split("+", 2)
        data = base64.b64decode(encoded)
        self.log_name, self.log_id = log_name, bytes.fromhex(log_id)
        self.log_key = Ed25519PublicKey.from_public_bytes(data[1:])
        public = key.public_key().public_bytes_raw()
        self.key_id = _h(name.encode() + b"\n\x04" + public)[:4]
        self.lock = threading.Lock()

    def add(self, body: bytes) -> tuple[int, str, bytes]:
        text = body.decode()
        head, sep, note = text.partition("\n\n")
        if not sep:
            return 400, "text/plain", b"no empty line before the checkpoint\n"
        lines = head.split("\n")
        if not lines[0].startswith("old "):
            return 400, "text/plain", b"no old size line\n"
        old = int(lines[0][4:])
        proof = [base64.b64decode(line) for line in lines[1:]]
        checkpoint, _, signatures = note.rpartition("\n\n")
        checkpoint += "\n"
        origin, size_text, root_text = checkpoint.split("\n")[:3]
        if origin != self.log_name:
            return 404, "text/plain", b"unknown log\n"
        if not self._signed(checkpoint, signatures):
            return 403, "text/plain", b"no signature by the log's key\n"
        size, root = int(size_text), base64.b64decode(root_text)
        if old > size:
            return 400, "text/plain", b"old size above the checkpoint's\n"
        with self.lock:
            held = (
                json.loads(self.state.read_text())
                if self.state.exists()
                else {"size": 0, "root": ""}
            )
            if old != held["size"]:
                return 409, "text/x.tlog.size", f"{held['size']}\n".encode()
            held_root = bytes.fromhex(held["root"])
            if old == size and held_root != root:
                return 409, "text/x.tlog.size", f"{held['size']}\n".encode()
            if old and not consistent(old, size, held_root, root, proof):
                return 422, "text/plain", b"the consistency proof does not verify\n"
            self.state.write_text(json.dumps({"size": size, "root": root.hex()}))
        now = int(time.time())
        message = f"cosignature/v1\ntime {now}\n{checkpoint}".encode()
        blob = self.key_id + now.to_bytes(8, "big") + self.key.sign(message)
        return 200, "text/plain", f"\u2014 {self.name} {base64.b64encode(blob).decode()}\n".encode()

    def _signed(self, checkpoint: str, signatures: str) -> bool:
        for line in signatures.strip("\n").split("\n"):
            name, _, encoded = line.removeprefix("\u2014 ").partition(" ")
            raw = base64.b64decode(encoded)
            if name != self.log_name or raw[:4] != self.log_id:
                continue
            try:
                self.log_key.verify(raw[4:], checkpoint.encode())
                return True
            except InvalidSignature:
                return False
        return False


def main() -> None:
    name, key_file, log_vkey, state = sys.argv[1:5]
    key = load_pem_private_key(Path(key_file).read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    witness = Witness(name, key, log_vkey, Path(state))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path != "/add-checkpoint":
                status, kind, answer = 404, "text/plain", b"not found\n"
            else:
                try:
                    status, kind, answer = witness.add(body)
                except (ValueError, IndexError, UnicodeDecodeError):
                    status, kind, answer = 400, "text/plain", b"malformed\n"
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
