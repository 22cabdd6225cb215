#include "controller/ha/etcd_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <limits>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

namespace troupe::ha {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Url {
  std::string scheme;  // "http", "https", or "" (bare host:port)
  std::string host;
  uint16_t port = 0;
};

// "http://host:port[/]", "https://host:port[/]" or "host:port".
std::optional<Url> parse_url(const std::string& text) {
  Url out;
  std::string rest = text;
  for (const char* scheme : {"http", "https"}) {
    std::string prefix = std::string(scheme) + "://";
    if (rest.rfind(prefix, 0) == 0) {
      out.scheme = scheme;
      rest = rest.substr(prefix.size());
      break;
    }
  }
  if (out.scheme.empty() && rest.find("://") != std::string::npos)
    return std::nullopt;
  if (!rest.empty() && rest.back() == '/')
    rest.pop_back();
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size())
    return std::nullopt;
  std::string port = rest.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  unsigned long p = std::stoul(port);
  if (p == 0 || p > 65535)
    return std::nullopt;
  out.host = rest.substr(0, colon);
  if (out.host.find('/') != std::string::npos)
    return std::nullopt;
  out.port = static_cast<uint16_t>(p);
  return out;
}

// An int64 of the gateway's JSON: a string (proto3's JSON form) or a number;
// absent fields are proto3 defaults (0).
int64_t num(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return 0;
  if (it->is_number_integer())
    return it->get<int64_t>();
  if (it->is_string()) {
    const auto& s = it->get_ref<const std::string&>();
    try {
      size_t used = 0;
      long long v = std::stoll(s, &used);
      if (used == s.size())
        return v;
    } catch (const std::exception&) {
    }
  }
  throw std::runtime_error(std::string("field ") + key + " is not an integer");
}

std::string str(int64_t v) {
  return std::to_string(v);
}

KeyValue key_value(const Json& kv) {
  KeyValue out;
  if (!EtcdClient::base64_decode(kv.value("key", std::string()), out.key) ||
      !EtcdClient::base64_decode(kv.value("value", std::string()), out.value))
    throw std::runtime_error("a key or value is not base64");
  out.create_revision = num(kv, "create_revision");
  out.mod_revision = num(kv, "mod_revision");
  out.version = num(kv, "version");
  out.lease = num(kv, "lease");
  return out;
}

std::optional<KeyValue> first_kv(const Json& range) {
  auto it = range.find("kvs");
  if (it == range.end() || !it->is_array() || it->empty())
    return std::nullopt;
  return key_value(it->front());
}

const char* target_name(Compare::Target t) {
  switch (t) {
    case Compare::Target::create_revision:
      return "CREATE";
    case Compare::Target::mod_revision:
      return "MOD";
    case Compare::Target::version:
      return "VERSION";
    case Compare::Target::value:
      return "VALUE";
    case Compare::Target::lease:
      return "LEASE";
  }
  return "CREATE";
}

Json compare_json(const Compare& c) {
  Json j{{"key", EtcdClient::base64_encode(c.key)},
         {"target", target_name(c.target)},
         {"result", "EQUAL"}};
  switch (c.target) {
    case Compare::Target::create_revision:
      j["create_revision"] = str(c.number);
      break;
    case Compare::Target::mod_revision:
      j["mod_revision"] = str(c.number);
      break;
    case Compare::Target::version:
      j["version"] = str(c.number);
      break;
    case Compare::Target::value:
      j["value"] = EtcdClient::base64_encode(c.value);
      break;
    case Compare::Target::lease:
      j["lease"] = str(c.number);
      break;
  }
  return j;
}

Json op_json(const Op& op) {
  Json key = EtcdClient::base64_encode(op.key);
  switch (op.kind) {
    case Op::Kind::put: {
      Json put{{"key", key}, {"value", EtcdClient::base64_encode(op.value)}};
      if (op.lease != 0)
        put["lease"] = str(op.lease);
      return Json{{"request_put", put}};
    }
    case Op::Kind::get:
      return Json{{"request_range", {{"key", key}}}};
    case Op::Kind::remove:
      return Json{{"request_delete_range", {{"key", key}}}};
  }
  return Json::object();
}

// The gateway's error object ({"error": "...", "code": N, "message": "..."},
// or the same under "error" of a streamed answer), if the answer is one.
struct GatewayError {
  int code = 0;  // gRPC status code
  std::string message;
};

std::optional<GatewayError> gateway_error(const Json& j) {
  const Json* e = &j;
  if (auto it = j.find("error"); it != j.end() && it->is_object())
    e = &*it;
  else if (j.find("code") == j.end() || j.find("result") != j.end())
    return std::nullopt;
  GatewayError out;
  if (auto c = e->find("code"); c != e->end() && c->is_number_integer())
    out.code = c->get<int>();
  out.message = e->value("message", e->value("error", std::string()));
  if (out.code == 0 && out.message.empty())
    return std::nullopt;
  return out;
}

// gRPC codes after which another member may answer: UNAVAILABLE (no
// leader, stopping), DEADLINE_EXCEEDED (request timed out), ABORTED.
bool try_elsewhere(int code) {
  return code == 14 || code == 4 || code == 10;
}

}  // namespace

Result<std::vector<std::string>> parse_endpoints(const std::string& list, bool tls) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string entry =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto url = parse_url(entry);
    if (!url)
      return Status(errc::invalid_argument, "etcd endpoint '" + entry +
                                                "' is not host:port, http://host:port or "
                                                "https://host:port");
    out.push_back(!url->scheme.empty() ? entry : (tls ? "https://" : "http://") + entry);
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return out;
}

Status check_endpoints(const std::vector<std::string>& endpoints, bool tls) {
  for (const auto& e : endpoints) {
    auto url = parse_url(e);
    if (!url)
      return Status(errc::invalid_argument, "etcd endpoint '" + e +
                                                "' is not host:port, http://host:port or "
                                                "https://host:port");
    if (url->scheme == "https" && !tls)
      return Status(errc::invalid_argument,
                    "etcd endpoint '" + e +
                        "' is https but no TLS files are given (the CA, a certificate and its "
                        "key; troupe-node: --tls-dir)");
    if (url->scheme == "http" && tls)
      return Status(errc::invalid_argument,
                    "etcd endpoint '" + e +
                        "' is plain http but TLS is set (troupe-node: --tls-dir): give "
                        "https://host:port or host:port (traffic to etcd is never sent "
                        "unencrypted when TLS is asked for)");
  }
  return Status::ok();
}

std::string EtcdClient::base64_encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

bool EtcdClient::base64_decode(const std::string& text, std::string& bytes) {
  if (text.size() % 4 != 0)
    return false;
  std::string out(3 * (text.size() / 4), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0)
    return false;
  // EVP_DecodeBlock counts the padding's bytes as zeros.
  size_t pad = 0;
  if (!text.empty() && text.back() == '=')
    pad = (text.size() >= 2 && text[text.size() - 2] == '=') ? 2 : 1;
  out.resize(static_cast<size_t>(n) - pad);
  bytes = std::move(out);
  return true;
}

namespace {

// The context of one new TLS connection: the files are read again each time,
// so a renewed certificate or CA applies to the next connection (as it does
// for CAF's connections, runtime/security/tls.hpp). invalid_argument naming
// the file that does not load.
Result<std::shared_ptr<ssl::context>> tls_context(const EtcdTls& files) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_compression);
  beast::error_code ec;
  std::string step;
  if (ctx->use_certificate_chain_file(files.certificate_file, ec); ec)
    step = "certificate " + files.certificate_file;
  else if (ctx->use_private_key_file(files.key_file, ssl::context::pem, ec); ec)
    step = "key " + files.key_file;
  else if (ctx->load_verify_file(files.ca_file, ec); ec)
    step = "CA " + files.ca_file;
  else if (ctx->set_verify_mode(ssl::verify_peer, ec); ec)
    step = "the verification mode";
  if (ec)
    return Status(errc::invalid_argument, "etcd TLS: " + step + ": " + ec.message());
  return ctx;
}

}  // namespace

// One kept-alive connection to one member, driven on an io_context of its
// own by the caller's thread: plain TCP, or TLS over it.
struct EtcdClient::Connection {
  size_t member = 0;
  asio::io_context ioc;
  // Declared before the stream, so that it outlives the SSL object made
  // from it.
  std::shared_ptr<ssl::context> tls_context;
  std::optional<beast::tcp_stream> plain;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  bool used = false;  // an answer came over it

  beast::tcp_stream& tcp() { return tls ? beast::get_lowest_layer(*tls) : *plain; }

  void run() {
    ioc.restart();
    ioc.run();
  }

  // An idle kept-alive connection that is readable was closed by the member
  // (EOF, or a TLS close_notify): it must not take the next request.
  bool closed_by_peer() {
    if (buffer.size() != 0)
      return false;
    pollfd p{tcp().socket().native_handle(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  // "" once the member's certificate is verified, for `host` too (its IP
  // address or DNS name must be in the certificate's subjectAltName), and
  // ours was sent; otherwise why not, in OpenSSL's words.
  std::string handshake(const std::string& host, Clock::time_point until) {
    SSL* ssl = tls->native_handle();
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    beast::error_code ec;
    asio::ip::make_address(host, ec);
    bool named = !ec ? X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str()) == 1
                     : X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0) == 1 &&
                           SSL_set_tlsext_host_name(ssl, host.c_str()) == 1;
    if (!named)
      return "cannot check its certificate against the name '" + host + "'";
    ec = {};
    tcp().expires_at(until);
    tls->async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
    run();
    if (!ec)
      return "";
    if (ec == beast::error::timeout)
      return "TLS handshake timed out";
    std::string why = "TLS handshake failed: " + ec.message();
    long verdict = SSL_get_verify_result(ssl);
    if (verdict != X509_V_OK)
      why += std::string(" (") + X509_verify_cert_error_string(verdict) + ")";
    return why;
  }

  // Sends `req` and reads the answer into `parser`, both by `until`.
  beast::error_code exchange(http::request<http::string_body>& req,
                             http::response_parser<http::string_body>& parser,
                             Clock::time_point until) {
    beast::error_code ec;
    tcp().expires_at(until);
    auto send = [&](auto& stream) {
      http::async_write(stream, req, [&](beast::error_code e, size_t) {
        ec = e;
        if (!e)
          http::async_read(stream, buffer, parser, [&](beast::error_code e2, size_t) { ec = e2; });
      });
    };
    if (tls)
      send(*tls);
    else
      send(*plain);
    run();
    return ec;
  }
};

// What one request to one member came to: an answer or a final error, or
// the member's reason to go on to the next (`retry`: this one again, on a
// new connection).
struct EtcdClient::Attempt {
  std::optional<Result<std::string>> answer;
  std::string why;
  bool retry = false;
  // The member may have taken the request without confirming it: it went
  // out and no answer came in time, or etcd said its proposal timed out
  // (etcd may still commit it once it has a quorum).
  bool unconfirmed = false;
};

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::endpoint() const {
  return answered_;
}

namespace {

// The member's address: its IPv4 address as given, or the name resolved.
Result<tcp::endpoint> resolve(asio::io_context& ioc, const std::string& host, uint16_t port) {
  beast::error_code ec;
  auto address = asio::ip::make_address_v4(host, ec);
  if (!ec)
    return tcp::endpoint(address, port);
  tcp::resolver resolver(ioc);
  auto found = resolver.resolve(tcp::v4(), host, std::to_string(port), ec);
  if (ec || found.empty())
    return Status(errc::unavailable, "cannot resolve " + host);
  return tcp::endpoint(*found.begin());
}

}  // namespace

Status EtcdClient::connect(size_t member, Clock::time_point until) {
  auto url = parse_url(options_.endpoints[member]);
  auto c = std::make_unique<Connection>();
  c->member = member;
  if (options_.tls) {
    auto ctx = tls_context(*options_.tls);
    if (!ctx)
      return ctx.status();
    c->tls_context = std::move(ctx.value());
    c->tls.emplace(c->ioc, *c->tls_context);
  } else {
    c->plain.emplace(c->ioc);
  }
  auto to = resolve(c->ioc, url->host, url->port);
  if (!to)
    return to.status();
  // SOCK_CLOEXEC: the processes the head starts must not inherit it.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return Status(errc::unavailable, "no socket");
  beast::error_code ec;
  c->tcp().socket().assign(tcp::v4(), fd, ec);
  if (ec) {
    ::close(fd);
    return Status(errc::unavailable, ec.message());
  }
  c->tcp().expires_at(until);
  c->tcp().async_connect(*to, [&](beast::error_code e) { ec = e; });
  c->run();
  if (ec)
    return Status(errc::unavailable,
                  ec == beast::error::timeout ? "connect timed out" : ec.message());
  c->tcp().socket().set_option(tcp::no_delay(true), ec);  // latency only
  if (c->tls) {
    if (auto why = c->handshake(url->host, until); !why.empty())
      return Status(errc::unavailable, why);
  }
  conn_ = std::move(c);
  return Status::ok();
}

namespace {

// Why a member's answer that is not 200 makes the call go elsewhere, or
// the final error it is (`final` set).
std::string refusal(const std::string& url, int status, const std::string& text,
                    std::optional<Status>& final) {
  Json j = Json::parse(text, nullptr, false);
  auto err = j.is_discarded() ? std::nullopt : gateway_error(j);
  std::string why = err ? err->message : "HTTP " + std::to_string(status);
  if (err && !try_elsewhere(err->code))
    final = Status(err->code == 5 ? errc::not_found : errc::internal, "etcd " + url + ": " + why);
  return why;
}

// Why a request on a connection got no answer.
std::string failure(const beast::error_code& ec, bool used, bool tls) {
  if (ec == beast::error::timeout)
    return "timed out";
  if (!ec)
    return "no answer";
  if (ec.category() == asio::error::get_ssl_category())
    return "TLS: " + ec.message();  // e.g. the member's alert: "sslv3 alert bad certificate"
  // etcd closes a new plain connection to a client URL that serves TLS
  // only, without a word.
  if (ec == http::error::end_of_stream && !used && !tls)
    return "closed without an answer: it may speak TLS only (then give https:// endpoints and "
           "the cluster's certificates; troupe-node: --tls-dir)";
  return ec.message();
}

}  // namespace

EtcdClient::Attempt EtcdClient::request(size_t member, const std::string& path,
                                        const std::string& body, Clock::time_point until) {
  Attempt out;
  const std::string& url = options_.endpoints[member];
  if (conn_ && (conn_->member != member || conn_->closed_by_peer()))
    conn_.reset();
  if (!conn_) {
    auto st = connect(member, until);
    if (!st && st.code() == errc::invalid_argument)
      out.answer = Result<std::string>(st);
    out.why = st.message();
    if (!st)
      return out;
  }
  auto parsed = parse_url(url);
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, parsed->host + ":" + std::to_string(parsed->port));
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  auto& c = *conn_;
  auto ec = c.exchange(req, parser, until);
  if (ec || !parser.is_done()) {
    // A kept-alive connection may have been closed as the request left:
    // the same member once more, on a new connection.
    out.retry = c.used && ec != beast::error::timeout;
    out.unconfirmed = ec == beast::error::timeout;
    out.why = failure(ec, c.used, options_.tls.has_value());
    conn_.reset();
    return out;
  }
  c.used = true;
  auto& res = parser.get();
  if (!res.keep_alive())
    conn_.reset();
  std::string text = std::move(res.body());
  if (res.result() != http::status::ok) {
    std::optional<Status> final;
    out.why = refusal(url, res.result_int(), text, final);
    if (!final) {
      out.unconfirmed = out.why.find("timed out") != std::string::npos ||
                        out.why.find("leader changed") != std::string::npos;
      conn_.reset();
      return out;
    }
    out.answer = Result<std::string>(*final);
  } else {
    out.answer = Result<std::string>(std::move(text));
  }
  current_ = member;
  answered_ = url;
  return out;
}

Result<std::string> EtcdClient::call(const std::string& path, const std::string& body) {
  const size_t n = options_.endpoints.size();
  if (n == 0)
    return Status(errc::invalid_argument, "no etcd endpoint");
  if (auto st = check_endpoints(options_.endpoints, options_.tls.has_value()); !st)
    return st;
  auto deadline = Clock::now() + options_.timeout;
  std::string reasons;
  bool unconfirmed = false;
  size_t first = current_;
  for (size_t attempt = 0; attempt < n; ++attempt) {
    size_t member = (first + attempt) % n;
    for (int tries = 0; tries < 2; ++tries) {
      auto now = Clock::now();
      if (now >= deadline)
        return Status(errc::timeout, "etcd did not answer " + path + " within " +
                                         std::to_string(options_.timeout.count()) + " ms" +
                                         (reasons.empty() ? "" : " (" + reasons + ")"));
      // What is left is shared by the members not tried yet: one that
      // hangs leaves time for the others.
      auto until = now + (deadline - now) / static_cast<int>(n - attempt);
      auto got = request(member, path, body, until);
      if (got.answer)
        return std::move(*got.answer);
      unconfirmed = unconfirmed || got.unconfirmed;
      reasons += (reasons.empty() ? "" : "; ") + options_.endpoints[member] + ": " + got.why;
      if (!got.retry)
        break;
    }
  }
  return Status(unconfirmed ? errc::timeout : errc::unavailable,
                "no etcd member answered " + path + " (" + reasons + ")");
}

namespace {

// The JSON of an answer; the gateway's error in a 200 answer (streamed
// calls) becomes a Status.
Result<Json> parse_answer(const std::string& text, const std::string& what) {
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status(errc::internal, "etcd answered " + what + " with something that is not JSON");
  if (auto err = gateway_error(j))
    return Status(err->code == 5 ? errc::not_found : try_elsewhere(err->code) ? errc::unavailable
                                                                               : errc::internal,
                  "etcd: " + err->message);
  return j;
}

template <class F>
auto decoding(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Status(errc::internal, "etcd's answer to " + what + " is malformed: " + e.what());
  }
}

}  // namespace

Result<int64_t> EtcdClient::grant(int64_t ttl_s) {
  auto text = call("/v3/lease/grant", Json{{"TTL", str(ttl_s)}}.dump());
  if (!text)
    return text.status();
  auto j = parse_answer(*text, "a lease grant");
  if (!j)
    return j.status();
  return decoding("a lease grant", [&]() -> Result<int64_t> {
    if (auto e = j->value("error", std::string()); !e.empty())
      return Status(errc::internal, "etcd refused a lease: " + e);
    int64_t id = num(*j, "ID");
    if (id == 0)
      return Status(errc::internal, "etcd granted no lease id");
    return id;
  });
}

Result<int64_t> EtcdClient::keep_alive(int64_t lease) {
  auto text = call("/v3/lease/keepalive", Json{{"ID", str(lease)}}.dump());
  if (!text)
    return text.status();
  // A stream of answers, one per request sent: the first line.
  auto line = text->substr(0, text->find('\n'));
  auto j = parse_answer(line, "a lease keep-alive");
  if (!j)
    return j.status();
  return decoding("a lease keep-alive", [&]() -> Result<int64_t> {
    const Json& r = j->contains("result") ? (*j)["result"] : *j;
    int64_t ttl = num(r, "TTL");
    if (ttl <= 0)
      return Status(errc::not_found, "etcd lease " + str(lease) + " expired or was revoked");
    return ttl;
  });
}

Status EtcdClient::revoke(int64_t lease) {
  auto text = call("/v3/lease/revoke", Json{{"ID", str(lease)}}.dump());
  if (!text)
    return text.status().code() == errc::not_found ? Status() : text.status();
  auto j = parse_answer(*text, "a lease revocation");
  if (!j && j.status().code() != errc::not_found)
    return j.status();
  return {};
}

Result<std::optional<KeyValue>> EtcdClient::get(const std::string& key) {
  auto text = call("/v3/kv/range", Json{{"key", base64_encode(key)}}.dump());
  if (!text)
    return text.status();
  auto j = parse_answer(*text, "a range");
  if (!j)
    return j.status();
  return decoding("a range", [&]() -> Result<std::optional<KeyValue>> { return first_kv(*j); });
}

Result<int64_t> EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  Json body{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0)
    body["lease"] = str(lease);
  auto text = call("/v3/kv/put", body.dump());
  if (!text)
    return text.status();
  auto j = parse_answer(*text, "a put");
  if (!j)
    return j.status();
  return decoding("a put", [&]() -> Result<int64_t> {
    return num(j->value("header", Json::object()), "revision");
  });
}

Result<TxnResult> EtcdClient::txn(const std::vector<Compare>& compare,
                                  const std::vector<Op>& success, const std::vector<Op>& failure) {
  Json body{{"compare", Json::array()}, {"success", Json::array()}, {"failure", Json::array()}};
  for (const auto& c : compare)
    body["compare"].push_back(compare_json(c));
  for (const auto& op : success)
    body["success"].push_back(op_json(op));
  for (const auto& op : failure)
    body["failure"].push_back(op_json(op));
  auto text = call("/v3/kv/txn", body.dump());
  if (!text)
    return text.status();
  auto j = parse_answer(*text, "a transaction");
  if (!j)
    return j.status();
  return decoding("a transaction", [&]() -> Result<TxnResult> {
    TxnResult out;
    out.succeeded = j->value("succeeded", false);
    out.revision = num(j->value("header", Json::object()), "revision");
    const auto& ops = out.succeeded ? success : failure;
    auto responses = j->value("responses", Json::array());
    if (responses.size() != ops.size())
      throw std::runtime_error(std::to_string(responses.size()) + " responses to " +
                               std::to_string(ops.size()) + " operations");
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != Op::Kind::get)
        continue;
      out.gets.push_back(first_kv(responses[i].value("response_range", Json::object())));
    }
    return out;
  });
}

}  // namespace troupe::ha
