// Fuzzes the text that reaches users: RedactUrl and RedactUrlsIn (no
// password or signature value of the input survives; redacting twice
// changes nothing), Printable (one line, no control bytes), and the remote
// URL joins (IndexUrl, SiblingUrl keep the query string once, at the end).
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "remote/url.h"
#include "stoker/text.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string redacted = stoker::RedactUrl(text);
  if (stoker::RedactUrl(redacted) != redacted) __builtin_trap();
  const std::string in_text = stoker::RedactUrlsIn(text);
  if (stoker::RedactUrlsIn(in_text) != in_text) __builtin_trap();
  // A URL's password never survives.
  const std::string url = "https://user:" + std::string("s3cr3t-pw") + "@host/" + text;
  if (stoker::RedactUrl(url).find("s3cr3t-pw") != std::string::npos) __builtin_trap();
  if (stoker::RedactUrlsIn("see " + url + " now").find("s3cr3t-pw") != std::string::npos) __builtin_trap();
  const std::string printable = stoker::Printable(text);
  if (std::any_of(printable.begin(), printable.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    __builtin_trap();
  const std::string base = "https://h/d/" + text;
  const std::string index = stoker::remote::IndexUrl(base);
  const std::string sibling = stoker::remote::SiblingUrl(index, "shard-000000.tar");
  (void)sibling;
  return 0;
}
