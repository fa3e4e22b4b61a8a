// The libcurl transport against a small HTTP/1.1 server on loopback: many
// threads' requests through the one event loop, bodies delivered exactly,
// ranges, connections reused across callers, errors named, a sink's error
// returned as is. Under the sanitizer presets this is what checks the event
// loop's locking.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/mutex.h"
#include "remote/http.h"

namespace stoker::remote {
namespace {

// Serves `objects` (path -> body) over HTTP/1.1 keep-alive, one thread per
// connection; honours "Range: bytes=N-" and "bytes=N-M"; counts the connections it accepted.
class TinyHttpServer {
 public:
  explicit TinyHttpServer(std::map<std::string, std::string> objects) : objects_(std::move(objects)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listener_, 64), 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~TinyHttpServer() {
    stop_ = true;
    acceptor_.join();
    {
      MutexLock lock(mu_);
      for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : connections_) t.join();
    MutexLock lock(mu_);
    for (int fd : open_) ::close(fd);
    ::close(listener_);
  }

  std::string Url(const std::string& path) const { return fmt::format("http://127.0.0.1:{}{}", port_, path); }
  int accepted() const { return accepted_.load(); }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      ++accepted_;
      {
        MutexLock lock(mu_);
        open_.push_back(fd);
      }
      connections_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  void Serve(int fd) {
    std::string buffer;
    char chunk[4096];
    for (;;) {
      std::size_t end;
      while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
        if (n <= 0) return;  // the client closed (fd is closed by the destructor)
        buffer.append(chunk, static_cast<std::size_t>(n));
      }
      const std::string head = buffer.substr(0, end);
      buffer.erase(0, end + 4);
      const auto sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
      const std::string path = head.substr(sp1 + 1, sp2 - sp1 - 1);
      std::size_t from = 0, to = std::string::npos;  // to: inclusive
      if (const auto r = head.find("Range: bytes="); r != std::string::npos) {
        const auto dash = head.find('-', r + 13);
        from = std::stoull(head.substr(r + 13, dash - r - 13));
        if (dash + 1 < head.size() && std::isdigit(static_cast<unsigned char>(head[dash + 1])))
          to = std::stoull(head.substr(dash + 1));
      }
      std::string response;
      const auto it = objects_.find(path);
      if (it == objects_.end()) {
        response = "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found";
      } else {
        const std::string& body = it->second;
        const std::size_t last = std::min(to, body.size() - 1);
        const std::string part = body.substr(std::min(from, body.size()), last + 1 - std::min(from, last + 1));
        response = from || to != std::string::npos
                       ? fmt::format("HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {}-{}/{}\r\n", from, last,
                                     body.size())
                       : std::string("HTTP/1.1 200 OK\r\n");
        response += fmt::format("ETag: \"v1\"\r\nContent-Length: {}\r\n\r\n", part.size()) + part;
      }
      for (std::size_t sent = 0; sent < response.size();) {
        const ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return;
        sent += static_cast<std::size_t>(n);
      }
    }
  }

  std::map<std::string, std::string> objects_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  Mutex mu_;
  std::vector<int> open_ GUARDED_BY(mu_);
  std::vector<std::thread> connections_;  // the acceptor's alone until it is joined
  std::thread acceptor_;
};

std::string PatternText(std::size_t size, unsigned seed) {
  std::string s(size, '\0');
  for (std::size_t i = 0; i < size; ++i) s[i] = static_cast<char>((i * 131 + seed * 17 + (i >> 9)) & 0xff);
  return s;
}

struct Fetched {
  Status status;
  HttpResponse response;
  std::string body;
};

Fetched Get(HttpTransport& transport, const std::string& url, std::optional<std::uint64_t> range = {},
            std::optional<std::uint64_t> range_end = {}) {
  Fetched f;
  HttpRequest request;
  request.url = url;
  request.range_start = range;
  request.range_end = range_end;
  auto response = transport.Get(request, [&](const HttpResponse&, std::span<const std::byte> data) {
    f.body.append(reinterpret_cast<const char*>(data.data()), data.size());
    return Status::Ok();
  });
  if (response.ok()) {
    f.response = *response;
  } else {
    f.status = response.error();
  }
  return f;
}

std::unique_ptr<HttpTransport> MakeTransportOrNull() {
  std::string why;
  return MakeCurlTransport(&why);
}

TEST(CurlTransport, ManyThreadsShareOneLoopAndItsConnections) {
  auto transport = MakeTransportOrNull();
  if (!transport) GTEST_SKIP() << "built without libcurl";
  std::map<std::string, std::string> objects;
  for (unsigned k = 0; k < 8; ++k) objects[fmt::format("/shard-{}.tar", k)] = PatternText(300'000 + k * 4099, k);
  TinyHttpServer server(objects);
  constexpr int kThreads = 8, kRounds = 4;
  std::atomic<int> failures{0};
  std::atomic<std::uint32_t> opened{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const std::string path = fmt::format("/shard-{}.tar", (t + r) % 8);
        Fetched f = Get(*transport, server.Url(path));
        if (!f.status.ok() || f.response.status != 200 || f.body != objects[path] || f.response.etag != "\"v1\"" ||
            f.response.content_length != objects[path].size())
          ++failures;
        opened += f.response.new_connections;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // Kept alive and shared: at most one connection per concurrent caller, and
  // the transport's count agrees with the server's.
  EXPECT_LE(server.accepted(), kThreads);
  EXPECT_EQ(static_cast<int>(opened.load()), server.accepted());
}

TEST(CurlTransport, RangesErrorsAndSinkFailures) {
  auto transport = MakeTransportOrNull();
  if (!transport) GTEST_SKIP() << "built without libcurl";
  const std::string body = PatternText(200'000, 7);
  TinyHttpServer server({{"/a.tar", body}});

  Fetched tail = Get(*transport, server.Url("/a.tar"), 150'000);
  ASSERT_TRUE(tail.status.ok()) << tail.status.ToString();
  EXPECT_EQ(tail.response.status, 206);
  EXPECT_EQ(tail.response.range_start, 150'000u);
  EXPECT_EQ(tail.response.total_size, body.size());
  EXPECT_EQ(tail.body, body.substr(150'000));

  Fetched part = Get(*transport, server.Url("/a.tar"), 1'000, 65'535);  // a chunk: bytes=1000-65535
  ASSERT_TRUE(part.status.ok()) << part.status.ToString();
  EXPECT_EQ(part.response.status, 206);
  EXPECT_EQ(part.response.range_start, 1'000u);
  EXPECT_EQ(part.body, body.substr(1'000, 64'536));

  Fetched missing = Get(*transport, server.Url("/missing.tar"));
  ASSERT_TRUE(missing.status.ok());  // an HTTP status is a response, not a transport error
  EXPECT_EQ(missing.response.status, 404);
  EXPECT_EQ(missing.response.error_body, "not found");
  EXPECT_TRUE(missing.body.empty());

  // The sink's own error stops the transfer and comes back as is.
  HttpRequest request;
  request.url = server.Url("/a.tar");
  auto refused = transport->Get(
      request, [](const HttpResponse&, std::span<const std::byte>) { return Status::Corruption("the sink refused"); });
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kCorruption);
  EXPECT_EQ(refused.error().message(), "the sink refused");

  // Nothing listens: retriable, and named.
  Fetched refused_connection = Get(*transport, "http://127.0.0.1:1/a.tar");
  EXPECT_EQ(refused_connection.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused_connection.status.message().find("http://127.0.0.1:1/a.tar"), std::string::npos);

  // A scheme libcurl cannot speak: final.
  Fetched unsupported = Get(*transport, "nope://127.0.0.1/a.tar");
  EXPECT_EQ(unsupported.status.code(), StatusCode::kInvalidArgument) << unsupported.status.ToString();

  // The same transport still works after all that.
  Fetched again = Get(*transport, server.Url("/a.tar"));
  EXPECT_TRUE(again.status.ok() && again.body == body);
}

}  // namespace
}  // namespace stoker::remote
