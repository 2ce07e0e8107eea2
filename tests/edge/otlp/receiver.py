"""A minimal OTLP/HTTP trace receiver for the edge tier: accepts `POST /v1/traces` with the JSON
encoding (what `querylayer serve --otlp-endpoint` sends), answers 200 with an empty
ExportTraceServiceResponse, and appends each request body as one line to the file given."""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, OUT = int(sys.argv[1]), sys.argv[2]


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path != "/v1/traces" or not self.headers.get("content-type", "").startswith("application/json"):
            self.send_response(415 if self.path == "/v1/traces" else 404)
            self.end_headers()
            return
        payload = json.loads(body)
        with open(OUT, "a", encoding="utf-8") as f:
            f.write(json.dumps(payload) + "\n")
        answer = b"{}"
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Receiver).serve_forever()
