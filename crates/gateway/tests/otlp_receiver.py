"""A small OTLP/HTTP traces receiver for the tracing tests: POST /v1/traces with the JSON
encoding, parsed strictly into the OpenTelemetry protocol's ExportTraceServiceRequest (the
opentelemetry-proto definitions, with Debian's protobuf), each span written to OUT as one JSON
line. A body that is not a valid request is answered 400 and written as an error line.

    python3 otlp_receiver.py PORT_FILE OUT     # listens on 127.0.0.1, an ephemeral port
"""
import base64
import http.server
import json
import sys

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

PORT_FILE, OUT = sys.argv[1], sys.argv[2]


def hex_ids_to_base64(doc):
    # OTLP/JSON writes trace and span ids in hex; protobuf's JSON mapping expects base64.
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in span:
                        span[k] = base64.b64encode(bytes.fromhex(span[k])).decode()
    return doc


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            assert self.path == "/v1/traces", self.path
            assert self.headers.get("Content-Type") == "application/json"
            req = json_format.Parse(json.dumps(hex_ids_to_base64(json.loads(body))),
                                    ExportTraceServiceRequest())
        except Exception as e:  # noqa: BLE001 - any failure is the test's finding
            with open(OUT, "a") as f:
                f.write(json.dumps({"error": str(e)}) + "\n")
            self.send_response(400)
            self.end_headers()
            return
        with open(OUT, "a") as f:
            for rs in req.resource_spans:
                service = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        attrs = {}
                        for a in s.attributes:
                            v = a.value
                            attrs[a.key] = v.string_value if v.HasField("string_value") else v.int_value
                        f.write(json.dumps({
                            "service": service.get("service.name"),
                            "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(), "name": s.name,
                            "kind": s.kind, "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano, "status": s.status.code,
                            "attributes": attrs}) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os  # noqa: E402
os.rename(PORT_FILE + ".tmp", PORT_FILE)
server.serve_forever()
