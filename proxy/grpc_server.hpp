// The gRPC ingress's connections (internal to proxy/): HTTP/2 through nghttp2
// on the proxy's own io threads, each call an Exchange like an HTTP/1.1
// request, so routing, retries, limits, deadlines, cancellation and streams
// are the HTTP path's. See docs/grpc.md.
//
// A call is a stream whose request is POST, content-type application/grpc*,
// with exactly one length-prefixed message (unary and server-streaming
// methods). Its Exchange's request() is that message as an HTTP request:
// POST to the method's full name ("/package.Service/Method"), the metadata as
// headers, the message's bytes as the body. Its answer maps back:
//   respond(2xx)        headers, the body as one message, grpc-status 0
//   respond(other)      trailers only: grpc-status from the HTTP status
//                       (grpc::code_for_http) and grpc-message from the
//                       answer's {"error": ...} or body
//   begin_stream/write_chunk/end_stream
//                       headers, each chunk as one message, then grpc-status
//                       0 (end_stream(true)) or INTERNAL "the stream ended
//                       early"
// An answer's own grpc-status (and grpc-message) header wins over the
// mapping; its other headers are sent as initial metadata.
// The client cancelling (RST_STREAM) or leaving (the connection closes) is
// on_client_gone().
#pragma once

#include <cstddef>

#include <memory>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

namespace troupe::proxy {

class HttpServer;

// Serves HTTP/2 with prior knowledge (h2c, what gRPC clients speak without
// TLS) on `socket`, accepted for io thread `thread` of `server`, whose
// handler gets each call. Call on that thread.
void serve_grpc(boost::asio::ip::tcp::socket socket, HttpServer& server, size_t thread);
// The same over TLS with `ctx` (the HTTPS port's ServerTls): the handshake
// must negotiate "h2" by ALPN (proxy/tls_context.hpp), within the server's
// idle timeout; a refused one is Handler::on_tls_refused("grpc_handshake").
void serve_grpc_tls(boost::asio::ip::tcp::socket socket,
                    std::shared_ptr<boost::asio::ssl::context> ctx, HttpServer& server,
                    size_t thread);

}  // namespace troupe::proxy
