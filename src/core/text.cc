#include "stoker/text.h"

#include <algorithm>
#include <array>
#include <cctype>

#include <fmt/format.h>

namespace stoker {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsSecretParameter(std::string_view name) {
  static constexpr std::array<std::string_view, 9> kMarks = {"signature", "token",   "credential", "secret", "password",
                                                             "key",       "session", "auth",       "sig"};
  const std::string lower = Lower(name);
  return std::any_of(kMarks.begin(), kMarks.end(),
                     [&](std::string_view m) { return lower.find(m) != std::string::npos; });
}

// Where a URL ends inside running text.
bool EndsUrl(char c) {
  return std::isspace(static_cast<unsigned char>(c)) || c == '\'' || c == '"' || c == '<' || c == '>' || c == '`';
}

}  // namespace

std::string Counted(std::uint64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + ' ' + std::string(n == 1 ? one : many);
}

std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += fmt::format("\\x{:02x}", u);
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string RedactUrl(std::string_view url) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::string(url);
  std::string out(url.substr(0, scheme_end + 3));
  std::string_view rest = url.substr(scheme_end + 3);
  // Authority: up to the first '/', '?' or '#'.
  const auto authority_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, authority_end);
  rest = authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
  if (const auto at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    const auto colon = userinfo.find(':');
    out += colon == std::string_view::npos ? "***" : fmt::format("{}:***", userinfo.substr(0, colon));
    out += '@';
    authority = authority.substr(at + 1);
  }
  out += authority;
  const auto query = rest.find('?');
  out += rest.substr(0, query);
  if (query == std::string_view::npos) return out;
  std::string_view params = rest.substr(query + 1);
  std::string_view fragment;
  if (const auto hash = params.find('#'); hash != std::string_view::npos) {
    fragment = params.substr(hash);
    params = params.substr(0, hash);
  }
  out += '?';
  bool first = true;
  while (true) {
    const auto amp = params.find('&');
    const std::string_view param = params.substr(0, amp);
    if (!first) out += '&';
    first = false;
    const auto eq = param.find('=');
    if (eq != std::string_view::npos && IsSecretParameter(param.substr(0, eq))) {
      out += param.substr(0, eq + 1);
      out += "***";
    } else {
      out += param;
    }
    if (amp == std::string_view::npos) break;
    params = params.substr(amp + 1);
  }
  out += fragment;
  return out;
}

std::string RedactUrlsIn(std::string_view text) {
  std::string out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t found = std::string_view::npos;
    for (std::string_view scheme : {"http://", "https://", "s3://"}) {
      const auto at = text.find(scheme, pos);
      if (at < found) found = at;
    }
    if (found == std::string_view::npos) {
      out += text.substr(pos);
      break;
    }
    out += text.substr(pos, found - pos);
    std::size_t end = found;
    while (end < text.size() && !EndsUrl(text[end])) ++end;
    // Punctuation after a URL belongs to the sentence ("URL: what happened").
    while (end > found && std::string_view(":,;.)").find(text[end - 1]) != std::string_view::npos) --end;
    out += RedactUrl(text.substr(found, end - found));
    pos = end;
  }
  return out;
}

}  // namespace stoker
