// What `stoker` says about a command line it cannot parse, beyond CLI11's
// own words: a misspelt command ("pakc") or option ("--shard-sise") is
// named with the one most likely meant.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

namespace stoker_cli {

// The name in `names` closest to `given`: one it begins (as "--nproc" begins
// "--nproc-per-node"), else the nearest by edit distance within about a
// third of its length; empty when none is close.
[[nodiscard]] std::string ClosestName(std::string_view given, std::span<const std::string> names);

// "; did you mean 'pack'?" or "; did you mean --shard-size?" for the
// command line `args` (argv without the program) that `app` refused with
// `error`; empty when there is no likely fix.
[[nodiscard]] std::string UsageHint(const CLI::App& app, std::span<const std::string> args,
                                    const CLI::ParseError& error);

}  // namespace stoker_cli
