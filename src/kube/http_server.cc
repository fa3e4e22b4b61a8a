#include "kube/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace stoker::kube {
namespace {

constexpr std::size_t kMaxBody = 16u << 20;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    default:
      return "Internal Server Error";
  }
}

// Appends what arrives on `fd`; false when nothing comes for 10 s or the peer closed.
bool ReadMore(int fd, std::string& buffer) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 10000) <= 0) return false;
  char chunk[65536];
  const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
  if (n <= 0) return false;
  buffer.append(chunk, static_cast<std::size_t>(n));
  return true;
}

void SendAll(int fd, const std::string& data) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

HttpResponse Error(int status, std::string message) {
  return {status, "text/plain", std::move(message) + "\n"};
}

void Serve(int fd, const HttpHandler& handler) {
  std::string buffer;
  std::size_t header_end;
  while ((header_end = buffer.find("\r\n\r\n")) == std::string::npos) {
    if (buffer.size() > 65536 || !ReadMore(fd, buffer)) return;
  }
  HttpRequest request;
  HttpResponse response;
  const std::string head = buffer.substr(0, header_end);
  const auto line_end = head.find("\r\n");
  const std::string line = head.substr(0, line_end);
  const auto sp1 = line.find(' '), sp2 = line.rfind(' ');
  std::size_t length = 0;
  bool bad = sp1 == std::string::npos || sp2 == sp1;
  if (!bad) {
    request.method = line.substr(0, sp1);
    request.path = line.substr(sp1 + 1, sp2 - sp1 - 1);
    std::size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
      auto end = head.find("\r\n", pos);
      if (end == std::string::npos) end = head.size();
      const std::string field = head.substr(pos, end - pos);
      pos = end + 2;
      const auto colon = field.find(':');
      if (colon == std::string::npos) continue;
      std::string name = field.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (name == "content-length") {
        char* e = nullptr;
        const std::string value = field.substr(colon + 1);
        length = std::strtoull(value.c_str(), &e, 10);
        bad = bad || e == value.c_str();
      }
      if (name == "transfer-encoding") response = Error(400, "chunked bodies are not supported: send Content-Length");
    }
  }
  if (bad) {
    response = Error(400, "malformed request");
  } else if (response.status == 200 && length > kMaxBody) {
    response = Error(413, fmt::format("a body of {} bytes is over the 16 MiB limit", length));
  } else if (response.status == 200) {
    request.body = buffer.substr(header_end + 4);
    while (request.body.size() < length)
      if (!ReadMore(fd, request.body)) return;
    request.body.resize(length);
    response = handler(request);
  }
  SendAll(fd, fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                          response.status, Reason(response.status), response.content_type, response.body.size(),
                          response.body));
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address, HttpHandler handler) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos)
    return Status::InvalidArgument(fmt::format("listen address '{}' must be HOST:PORT, e.g. 0.0.0.0:9453", address));
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int r = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); r != 0)
    return Status::InvalidArgument(fmt::format("listen address '{}': {}", address, ::gai_strerror(r)));
  UniqueFd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int one = 1;
  Status status;
  if (!fd.valid()) {
    status = Status::FromErrno(errno, "socket");
  } else {
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd.get(), 64) != 0)
      status = Status::FromErrno(errno, fmt::format("listening on {}", address));
  }
  ::freeaddrinfo(found);
  if (!status.ok()) return status;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(fd), actual, std::move(handler)));
}

HttpServer::HttpServer(UniqueFd listener, int port, HttpHandler handler)
    : listener_(std::move(listener)), port_(port), handler_(std::move(handler)) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

HttpServer::~HttpServer() {
  stopping_ = true;
  ::shutdown(listener_.get(), SHUT_RDWR);
  acceptor_.join();
  while (active_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void HttpServer::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ++active_;
    std::thread([this, fd] {
      Serve(fd, handler_);
      ::close(fd);
      --active_;
    }).detach();
  }
}

}  // namespace stoker::kube
