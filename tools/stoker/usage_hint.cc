#include "usage_hint.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

namespace stoker_cli {
namespace {

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The subcommand the arguments reached: the deepest one CLI11 parsed.
const CLI::App* Reached(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands({}))
    if (sub->parsed()) return Reached(*sub);
  return &app;
}

}  // namespace

std::string ClosestName(std::string_view given, std::span<const std::string> names) {
  if (given.size() < 2) return {};
  std::string best;
  for (const std::string& name : names)
    if (name.size() > given.size() && name.starts_with(given) && (best.empty() || name.size() < best.size()))
      best = name;
  if (!best.empty()) return best;
  std::size_t best_distance = std::max<std::size_t>(2, given.size() / 3) + 1;
  for (const std::string& name : names) {
    const std::size_t d = EditDistance(given, name);
    if (d < best_distance) best_distance = d, best = name;
  }
  return best;
}

std::string UsageHint(const CLI::App& app, std::span<const std::string> args, const CLI::ParseError& error) {
  const CLI::App* reached = Reached(app);
  // A command where one was expected ("stoker pakc ..."): the first word that is no option.
  if (reached->get_subcommands({}).size() > 0 && dynamic_cast<const CLI::RequiredError*>(&error) != nullptr) {
    std::vector<std::string> commands, path;  // what may come next; the commands that came before
    for (const CLI::App* sub : reached->get_subcommands({})) commands.push_back(sub->get_name());
    for (const CLI::App* up = reached; up != nullptr; up = up->get_parent()) path.push_back(up->get_name());
    for (const std::string& arg : args) {
      if (arg.starts_with("-") || std::find(path.begin(), path.end(), arg) != path.end()) continue;
      const std::string close = ClosestName(arg, commands);
      return close.empty() ? fmt::format("; '{}' is no command", arg)
                           : fmt::format("; '{}' is no command: did you mean '{}'?", arg, close);
    }
    return {};
  }
  // An option the command does not take ("--shard-sise").
  std::vector<std::string> options;
  for (const CLI::Option* option : reached->get_options())
    for (const std::string& name : option->get_lnames()) options.push_back("--" + name);
  for (const std::string& arg : args) {
    if (!arg.starts_with("--")) continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (std::find(options.begin(), options.end(), name) != options.end()) continue;
    if (std::string_view(error.what()).find(name) == std::string_view::npos) continue;  // not the one refused
    const std::string close = ClosestName(name, options);
    if (!close.empty()) return fmt::format("; did you mean {}?", close);
  }
  return {};
}

}  // namespace stoker_cli
