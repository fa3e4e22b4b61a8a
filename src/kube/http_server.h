// A small HTTP/1.1 server for the node's card state and the scheduler
// extender's webhook: one request per connection (Connection: close),
// bodies by Content-Length up to 16 MiB, a thread per connection, a
// handler per request. Enough for the kube-scheduler and Prometheus-style
// clients; not a general web server.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/unique_fd.h"
#include "stoker/status.h"

namespace stoker::kube {

struct HttpRequest {
  std::string method, path, body;
};
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

class HttpServer {
 public:
  // Listens on `address` ("HOST:PORT"; PORT 0 picks a free one).
  [[nodiscard]] static Result<std::unique_ptr<HttpServer>> Start(const std::string& address, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  [[nodiscard]] int port() const { return port_; }

 private:
  HttpServer(UniqueFd listener, int port, HttpHandler handler);
  void AcceptLoop();
  UniqueFd listener_;
  int port_;
  HttpHandler handler_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0};
  std::thread acceptor_;
};

}  // namespace stoker::kube
