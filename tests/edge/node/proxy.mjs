// Test-only: a reverse proxy that adds `Authorization: Bearer $QUERYLAYER_PROXY_SECRET` to every
// request and forwards it to $QUERYLAYER_PROXY_TARGET unchanged otherwise (Host and Origin
// included, so the edge's DNS-rebinding checks see what the client sent). The MCP conformance
// suite cannot send headers; this lets it reach an authenticated edge.
// usage: node proxy.mjs <listen-port>
import http from "node:http";

const target = new URL(process.env.QUERYLAYER_PROXY_TARGET);
const secret = process.env.QUERYLAYER_PROXY_SECRET;
const port = Number(process.argv[2]);

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${secret}` };
  const upstream = http.request(
    { host: target.hostname, port: target.port, method: req.method, path: req.url, headers },
    (answer) => {
      res.writeHead(answer.statusCode, answer.headers);
      answer.pipe(res);
    },
  );
  upstream.on("error", () => {
    res.writeHead(502);
    res.end();
  });
  req.pipe(upstream);
});
server.listen(port, "127.0.0.1", () => console.log(`proxy listening on ${port}`));
