// stoker/text.h: text that reaches users: names made safe to print on one line, and URLs
// with their secrets taken out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace stoker {

// `text` with control characters (newline, tab, escape, ...) and backslashes
// written as C escapes (\n, \t, \x1b, \\), so that a key or path from a
// dataset prints as one unambiguous line. Other bytes pass unchanged.
[[nodiscard]] std::string Printable(std::string_view text);

// "1 shard", "2 shards": `n` and the noun in the number it takes.
[[nodiscard]] std::string Counted(std::uint64_t n, std::string_view one, std::string_view many);

// `url` with its secrets replaced by "***": the password of a user:password@
// part, and the values of query parameters that carry signatures, tokens,
// credentials or keys (X-Amz-Signature, X-Amz-Credential,
// X-Amz-Security-Token, sig, token, ...). Text that is not a URL is returned
// as it is. Every URL stoker prints or puts in an error goes through this.
[[nodiscard]] std::string RedactUrl(std::string_view url);

// RedactUrl applied to every http:// or https:// URL inside `text` (error
// messages from libraries that quote the URL they were given).
[[nodiscard]] std::string RedactUrlsIn(std::string_view text);

}  // namespace stoker
