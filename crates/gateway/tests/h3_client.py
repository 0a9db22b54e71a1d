#!/usr/bin/env python3
"""A small HTTP/3 client on aioquic (an independent QUIC/HTTP/3 implementation), for tests.

Prints one JSON object per request: status, headers, body length, the SHA-256 of the body and
(if short) the body itself. A request body (`--body-size`) is pseudo-random, so an echo that
reorders, drops or repeats bytes shows in `body_sha256` != `sent_sha256`.
"""
import argparse
import asyncio
import gzip
import hashlib
import json
import os
import pickle
import random
import socket
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset

# H3_REQUEST_CANCELLED (RFC 9114 §8.1): what a client says when it no longer wants a response.
H3_REQUEST_CANCELLED = 0x10C


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.responses = {}
        self.waiters = {}
        # The largest UDP datagram received from the server (its path MTU discovery at work).
        self.largest_datagram = 0
        # Stream ID -> body bytes after which the client stops reading (STOP_SENDING).
        self.stop_after = {}
        # Streams the client stopped: what still arrives on them is dropped.
        self.stopped = set()
        # The error code of the connection's close, once it has closed.
        self.closed_code = None
        # With --migrate-after-bytes: body bytes after which the client moves to
        # `migrate_to` (host, port), and how many had arrived when it did.
        self.migrate_at = None
        self.migrate_to = ("::", 0)
        self.migrated_at = None

    def datagram_received(self, data, addr):
        self.largest_datagram = max(self.largest_datagram, len(data))
        super().datagram_received(data, addr)

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.closed_code = event.error_code
            # The server's reason for closing, for tests to check (e.g. 0x2 CONNECTION_REFUSED).
            print(f"connection closed: error_code={event.error_code:#x} reason={event.reason_phrase!r}", file=sys.stderr, flush=True)
            # Requests still waiting will get no answer.
            for w in self.waiters.values():
                if not w.done():
                    w.set_exception(ConnectionError(f"connection closed: {event.error_code:#x}"))
            self.waiters.clear()
        if isinstance(event, StreamReset) and event.stream_id not in self.stopped:
            # The server abandoned the response (e.g. its upstream failed mid-body): report
            # what arrived and the reset's code instead of waiting for an end that never comes.
            r = self.responses.pop(event.stream_id, {"headers": [], "body": bytearray()})
            r["reset"] = event.error_code
            w = self.waiters.pop(event.stream_id, None)
            if w and not w.done():
                w.set_result(r)
        for ev in self.h3.handle_event(event):
            if isinstance(ev, (HeadersReceived, DataReceived)):
                if ev.stream_id in self.stopped:
                    continue
                r = self.responses.setdefault(ev.stream_id, {"headers": [], "body": bytearray()})
                if isinstance(ev, HeadersReceived):
                    r["headers"] += ev.headers
                else:
                    r["body"] += ev.data
                if (self.migrate_at is not None and self.migrated_at is None
                        and len(r["body"]) >= self.migrate_at):
                    # Mid-transfer, as a phone moving from 4G to Wi-Fi does.
                    self.migrated_at = len(r["body"])
                    asyncio.ensure_future(rebind(self, *self.migrate_to))
                limit = self.stop_after.get(ev.stream_id)
                if limit is not None and len(r["body"]) >= limit and not ev.stream_ended:
                    # Stop reading, as a browser does when a tab closes mid-download.
                    self._quic.stop_stream(ev.stream_id, H3_REQUEST_CANCELLED)
                    self.stopped.add(ev.stream_id)
                    r["stopped"] = True
                    w = self.waiters.pop(ev.stream_id, None)
                    if w and not w.done():
                        w.set_result(self.responses.pop(ev.stream_id))
                    self.transmit()
                    continue
                if ev.stream_ended:
                    w = self.waiters.pop(ev.stream_id, None)
                    if w and not w.done():
                        w.set_result(self.responses.pop(ev.stream_id))

    async def request(self, method, authority, path, body=None, headers=(), trailers=(),
                      stop_after=None, reset_upload_after=None):
        sid = self._quic.get_next_available_stream_id()
        if stop_after is not None:
            self.stop_after[sid] = stop_after
        hs = [(b":method", method.encode()), (b":scheme", b"https"),
              (b":authority", authority.encode()), (b":path", path.encode())]
        hs += [(k.encode(), v.encode()) for k, v in headers]
        self.h3.send_headers(sid, hs, end_stream=body is None)
        if body is not None and reset_upload_after is not None:
            # Part of the body, then RESET_STREAM: an upload the client abandons (a phone
            # losing its network, a cancelled file upload). Whatever answer comes within 5 s.
            self.h3.send_data(sid, body[:reset_upload_after], end_stream=False)
            self.transmit()
            await asyncio.sleep(0.2)
            self._quic.reset_stream(sid, H3_REQUEST_CANCELLED)
            fut = asyncio.get_running_loop().create_future()
            self.waiters[sid] = fut
            self.transmit()
            try:
                r = await asyncio.wait_for(fut, 5)
            except asyncio.TimeoutError:
                r = {"headers": [], "body": bytearray()}
            r["upload_reset"] = True
            return r
        if body is not None:
            self.h3.send_data(sid, body, end_stream=not trailers)
            if trailers:
                # A trailer section: a HEADERS frame after the body (RFC 9114 §4.1).
                self.h3.send_headers(sid, [(k.encode(), v.encode()) for k, v in trailers],
                                     end_stream=True)
        fut = asyncio.get_running_loop().create_future()
        self.waiters[sid] = fut
        self.transmit()
        return await asyncio.wait_for(fut, 120)


async def rebind(client, host="::", port=0):
    """Moves the connection to a new socket bound to (host, port): the next packets leave
    from the new address, as after a NAT rebinding or a network change."""
    loop = asyncio.get_running_loop()
    old = client._transport
    # Same socket family as aioquic's own (dual-stack IPv6).
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    if ":" not in host:
        host = "::ffff:" + host
    sock.bind((host, port, 0, 0))
    await loop.create_datagram_endpoint(lambda: client, sock=sock)
    old.close()
    client._quic.change_connection_id()
    client.transmit()


# With --ocsp: the leaf certificate's entry extensions as the server sent them.
PEER_CERT_EXTENSIONS = {}


def patch_hello(ask_ocsp, rsa_only):
    """aioquic sends no status_request and keeps the Certificate entries' extensions unread:
    with ask_ocsp, add the extension (RFC 6066 §8: OCSP, no responder ids, no extensions) to the ClientHello
    and keep the leaf entry's extensions, where TLS 1.3 carries a stapled response (RFC 8446
    §4.4.2.1). With rsa_only, offer RSA-PSS signatures only (the server's RSA certificate)."""
    import aioquic.tls as tls
    send_hello = tls.Context._client_send_hello
    pull_certificate = tls.pull_certificate

    def hello(self, output_buf):
        if ask_ocsp and not any(t == tls.ExtensionType.STATUS_REQUEST
                                for t, _ in self.handshake_extensions):
            self.handshake_extensions.append((tls.ExtensionType.STATUS_REQUEST, b"\x01\x00\x00\x00\x00"))
        if rsa_only:
            self._signature_algorithms = [tls.SignatureAlgorithm.RSA_PSS_RSAE_SHA256]
        return send_hello(self, output_buf)

    def pull(buf):
        # The client's only Certificate message is the server's (this client sends none
        # without --cert, and reads none of its own).
        certificate = pull_certificate(buf)
        if certificate.certificates:
            PEER_CERT_EXTENSIONS.setdefault("leaf", certificate.certificates[0][1])
        return certificate

    tls.Context._client_send_hello = hello
    tls.pull_certificate = pull


def stapled_ocsp(extensions):
    """The OCSP response in a certificate entry's extensions (status_request: type 1, a 24-bit
    length, the DER), or None."""
    i = 0
    while i + 4 <= len(extensions):
        kind = int.from_bytes(extensions[i:i + 2], "big")
        n = int.from_bytes(extensions[i + 2:i + 4], "big")
        data = extensions[i + 4:i + 4 + n]
        if kind == 5 and len(data) >= 4 and data[0] == 1:
            return data[4:4 + int.from_bytes(data[1:4], "big")]
        i += 4 + n
    return None


def local_addr(client):
    host, port = client._transport.get_extra_info("sockname")[:2]
    return f"{host.removeprefix('::ffff:')}:{port}"


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="localhost")
    p.add_argument("--method", default="GET")
    p.add_argument("--path", action="append", default=[])
    p.add_argument("--body-size", type=int)
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--trailer", action="append", default=[],
                   help="request trailer 'name: value' (sent after the body)")
    p.add_argument("--print-cid", action="store_true", help="print the server's connection ID (hex)")
    p.add_argument("--no-request", action="store_true", help="send no request (with --idle-ping-ms)")
    p.add_argument("--idle-ping-ms", type=int,
                   help="after the requests, send nothing but a PING this often (up to 15 s) and "
                        "print how long the server took to close the connection")
    p.add_argument("--session-file", help="save the session ticket here; with --zero-rtt, resume from it")
    p.add_argument("--zero-rtt", action="store_true", help="send the requests as 0-RTT early data")
    p.add_argument("--linger-ms", type=int, default=0,
                   help="after the requests, keep the connection open this long or until the server closes it")
    p.add_argument("--stop-after", type=int,
                   help="stop reading the first response after this many body bytes "
                        "(STOP_SENDING, H3_REQUEST_CANCELLED); later paths go on the same connection")
    p.add_argument("--reset-upload-after", type=int,
                   help="send this many bytes of the first request's body, then reset the stream")
    p.add_argument("--migrate-after", type=int, default=-1,
                   help="after this many requests, move to a new UDP source port (path migration)")
    p.add_argument("--cert", help="a client certificate (PEM) to present, with --key")
    p.add_argument("--key", help="the client certificate's private key (PEM)")
    p.add_argument("--server", default="127.0.0.1", help="the server's address")
    p.add_argument("--local-port", type=int, default=0, help="the client's first UDP port")
    p.add_argument("--migrate-after-bytes", type=int,
                   help="move to --migrate-bind once this many bytes of the first response arrived")
    p.add_argument("--migrate-bind", default="::",
                   help="HOST[:PORT] the client moves to (default: any address, a new port)")
    p.add_argument("--idle-timeout", type=float, help="QUIC idle timeout (seconds)")
    p.add_argument("--timeout", type=float, default=120, help="seconds a response may take")
    p.add_argument("--ocsp", action="store_true",
                   help="ask for the server's OCSP response (status_request) and print its SHA-256")
    p.add_argument("--rsa-only", action="store_true", help="offer RSA-PSS signatures only")
    args = p.parse_args()
    if args.ocsp or args.rsa_only:
        patch_hello(args.ocsp, args.rsa_only)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=args.host)
    config.verify_mode = ssl.CERT_NONE
    if args.idle_timeout:
        config.idle_timeout = args.idle_timeout
    if args.cert:
        config.load_cert_chain(args.cert, args.key)
    if args.zero_rtt:
        with open(args.session_file, "rb") as f:
            config.session_ticket = pickle.load(f)

    def save_ticket(ticket):
        if args.session_file and not args.zero_rtt:
            with open(args.session_file, "wb") as f:
                pickle.dump(ticket, f)

    async with connect(args.server, args.port, configuration=config, create_protocol=Client,
                       session_ticket_handler=save_ticket, local_port=args.local_port,
                       wait_connected=not args.zero_rtt) as client:
        if args.migrate_after_bytes is not None:
            host, _, port = args.migrate_bind.rpartition(":") if "." in args.migrate_bind \
                else (args.migrate_bind, "", "0")
            client.migrate_at = args.migrate_after_bytes
            client.migrate_to = (host, int(port or 0))
        for i, path in enumerate([] if args.no_request else (args.path or ["/"])):
            if i == args.migrate_after:
                # A new socket (new source port) for the same connection, as a phone moving
                # from 4G to Wi-Fi would; the next packets arrive from the new address.
                await rebind(client)
            body = None
            if args.body_size is not None:
                body = random.Random(args.body_size).randbytes(args.body_size)
            headers = [h.split(":", 1) for h in args.header]
            headers = [(k.strip().lower(), v.strip()) for k, v in headers]
            trailers = [t.split(":", 1) for t in args.trailer]
            trailers = [(k.strip().lower(), v.strip()) for k, v in trailers]
            first = i == 0
            try:
                r = await asyncio.wait_for(
                    client.request(args.method, args.host, path, body, headers, trailers,
                                   args.stop_after if first else None,
                                   args.reset_upload_after if first else None),
                    args.timeout)
            except (asyncio.TimeoutError, ConnectionError) as e:
                # No answer: say how far the response got, and fail.
                got = sum(len(x["body"]) for x in client.responses.values())
                print(json.dumps({"error": type(e).__name__, "body_len": got,
                                  "migrated_at": client.migrated_at}), flush=True)
                sys.exit(1)
            hdrs = {k.decode(): v.decode() for k, v in r["headers"]}
            out = {"status": int(hdrs.get(":status", "0")), "headers": hdrs, "body_len": len(r["body"]),
                   "body_sha256": hashlib.sha256(r["body"]).hexdigest()}
            for k in ("reset", "stopped", "upload_reset"):
                if k in r:
                    out[k] = r[k]
            if hdrs.get("content-encoding") == "gzip" and "reset" not in r:
                # A gzipped response, decoded: its bytes must be what the upstream sent.
                out["decoded_sha256"] = hashlib.sha256(gzip.decompress(bytes(r["body"]))).hexdigest()
            if body is not None:
                out["sent_sha256"] = hashlib.sha256(body).hexdigest()
            if len(r["body"]) <= 4096:
                out["body"] = r["body"].decode("utf-8", "replace")
            out["local_port"] = client._transport.get_extra_info("sockname")[1]
            out["local_addr"] = local_addr(client)
            if client.migrated_at is not None:
                out["migrated_at"] = client.migrated_at
            tls = client._quic.tls
            out["resumed"] = bool(getattr(tls, "session_resumed", False))
            out["early_data_accepted"] = bool(getattr(tls, "early_data_accepted", False))
            out["largest_datagram"] = client.largest_datagram
            # The server's certificate (aioquic keeps it in a private field).
            peer = getattr(tls, "_peer_certificate", None)
            if peer is not None:
                out["peer_subject"] = peer.subject.rfc4514_string()
            if args.ocsp:
                der = stapled_ocsp(PEER_CERT_EXTENSIONS.get("leaf", b""))
                out["ocsp_sha256"] = None if der is None else hashlib.sha256(der).hexdigest()
            if args.print_cid:
                # aioquic keeps the peer's current connection ID in a private field.
                out["server_cid"] = client._quic._peer_cid.cid.hex()
            print(json.dumps(out), flush=True)
        if args.idle_ping_ms:
            # A client that keeps its connection alive at the QUIC layer but asks for nothing.
            loop = asyncio.get_running_loop()
            start = loop.time()
            closed = asyncio.ensure_future(client.wait_closed())
            while not closed.done() and loop.time() - start < 15:
                client._quic.send_ping(0)
                client.transmit()
                await asyncio.wait([closed], timeout=args.idle_ping_ms / 1000)
            out = {"closed_after_ms": round((loop.time() - start) * 1000) if closed.done() else None,
                   "error_code": client.closed_code}
            print(json.dumps(out), flush=True)
        if args.linger_ms:
            try:
                await asyncio.wait_for(client.wait_closed(), args.linger_ms / 1000)
            except asyncio.TimeoutError:
                print("linger ended with the connection open", file=sys.stderr, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
