// FetchObject against a scripted server whose faults come from the input
// (statuses, resets, truncation, ignored ranges, changed ETags, corruption),
// and ParseRetryAfter and ParseHeaderLine on the input's tail. Invariants: a
// download that succeeds delivered exactly the object; every failure names
// the URL; parsed headers are consistent.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fake_clock.h"
#include "remote/fake_transport.h"
#include "remote/http.h"

using stoker::remote::testing::Fault;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::string url = "http://fuzz/object";
  const std::size_t object_size = 1 + ((data[0] << 8 | data[1]) % 8192);
  stoker::remote::testing::FakeTransport transport;
  const auto object = stoker::remote::testing::Pattern(object_size, data[0]);
  transport.Put(url, object);
  std::size_t i = 2;
  for (; i + 3 <= size && i < 2 + 3 * 12; i += 3) {
    const int kind = data[i] % 7;
    const std::uint64_t param = static_cast<std::uint64_t>(data[i + 1]) << 8 | data[i + 2];
    if (kind == 0) {
      transport.AddFault(
          url, stoker::remote::testing::StatusFault(400 + static_cast<long>(param % 200),
                                                    param % 3 == 0 ? std::optional<double>(param % 5) : std::nullopt));
    } else {
      static constexpr Fault::Kind kKinds[] = {Fault::Kind::kReset,       Fault::Kind::kTruncate,
                                               Fault::Kind::kIgnoreRange, Fault::Kind::kChangeEtag,
                                               Fault::Kind::kCorrupt,     Fault::Kind::kTruncate};
      transport.AddFault(url, stoker::remote::testing::MakeFault(kKinds[kind - 1], param % (object_size + 1)));
    }
  }
  stoker::testing::FakeClock clock;  // backoff never sleeps for real
  stoker::remote::RetryPolicy policy;
  policy.max_attempts = 6;
  policy.clock = &clock;
  policy.deadline_seconds = data[0] % 2 == 0 ? 0 : 1 + data[1] % 60;
  std::vector<std::byte> got;
  stoker::remote::HttpRequest request;
  request.url = url;
  const bool known_size = size % 2 == 0;
  stoker::Status s = stoker::remote::FetchObject(
      transport, request, known_size ? std::optional<std::uint64_t>(object_size) : std::nullopt,
      [&](std::span<const std::byte> d) {
        got.insert(got.end(), d.begin(), d.end());
        return stoker::Status::Ok();
      },
      [&] {
        got.clear();
        return stoker::Status::Ok();
      },
      policy);
  if (s.ok()) {
    // A corrupted body of the right size is the checksum's job (the cache's), not the fetcher's.
    if (got.size() != object.size()) __builtin_trap();
  } else if (s.message().find(url) == std::string::npos) {
    __builtin_trap();
  }
  if (i < size) {
    const std::string tail(reinterpret_cast<const char*>(data + i), size - i);
    auto delay = stoker::remote::ParseRetryAfter(tail, 1e9);
    if (delay && !(*delay >= 0)) __builtin_trap();
    // The same bytes as response header lines: whatever is read is consistent.
    stoker::remote::HttpResponse head;
    std::size_t from = 0;
    while (from <= tail.size()) {
      const std::size_t nl = std::min(tail.find('\n', from), tail.size());
      stoker::remote::ParseHeaderLine(std::string_view(tail).substr(from, nl - from + (nl < tail.size())), 1e9, &head);
      if (head.range_start.has_value() != head.total_size.has_value()) __builtin_trap();
      if (head.range_start && *head.range_start >= *head.total_size) __builtin_trap();
      if (head.status < 0 || head.status > 999) __builtin_trap();
      if (head.retry_after_seconds && !(*head.retry_after_seconds >= 0)) __builtin_trap();
      from = nl + 1;
    }
  }
  return 0;
}
